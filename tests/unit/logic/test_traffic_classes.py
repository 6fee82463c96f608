"""spec.speculative.classes (issue 39): each refusal names the field and says why; the class's
spec is the resource's with the class's K and tuning. The CEL twins are checked against the
real API server in tests/cluster/test_spec_refusals.py."""

from __future__ import annotations

import pytest

from mtp_operator.api import classes as classes_api
from mtp_operator.api.crd import crd
from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.traffic_classes import class_spec, class_specs
from mtp_operator.validation import spec_problems

# The field report's thresholds (an example, not a default): <128 tokens K=4, 128-512 K=3,
# >512 K=2, written as inclusive ranges.
FIELD_REPORT = [
    {"name": "short", "promptTokens": {"max": 127}, "numSpeculativeTokens": 4},
    {"name": "mid", "promptTokens": {"min": 128, "max": 512}, "numSpeculativeTokens": 3},
    {"name": "long", "promptTokens": {"min": 513}, "numSpeculativeTokens": 2},
]


def _problems(classes, **speculative):
    spec = {"model": "org/m", "speculative": {"classes": classes, **speculative}}
    return spec_problems(spec)[1]


def _fields(problems):
    return [p[0] for p in problems]


def test_the_field_reports_ranges_and_a_header_class_are_accepted():
    code = {"name": "code", "header": {"name": "x-mtp-class", "value": "code"},
            "numSpeculativeTokens": 1}
    assert _problems([*FIELD_REPORT, code]) == []


def test_each_class_spec_carries_its_own_k_and_tuning():
    spec = MTPInferenceSpec.model_validate({
        "model": "org/m",
        "speculative": {"tuning": {"mode": "Recommend"}, "classes": [
            {**FIELD_REPORT[0], "tuning": {"mode": "Auto", "candidates": [2, 4]}},
            FIELD_REPORT[2],
        ]},
    })
    specs = class_specs(spec)
    assert list(specs) == ["short", "long"]
    assert specs["short"].speculative.num_speculative_tokens == 4
    assert specs["short"].speculative.tuning.mode == "Auto"
    assert specs["long"].speculative.num_speculative_tokens == 2
    assert specs["long"].speculative.tuning.mode == "Recommend"  # the resource's
    for s in specs.values():
        assert s.speculative.classes is None
        assert s.model == spec.model
    assert class_spec(spec, spec.speculative.classes[1]) == specs["long"]


@pytest.mark.parametrize(
    ("classes", "field", "says"),
    [
        # overlap: 100-127 lies in both
        ([FIELD_REPORT[0], {"name": "mid", "promptTokens": {"min": 100, "max": 512}},
          FIELD_REPORT[2]], "speculative.classes[1].promptTokens", "100-127 tokens overlap"),
        # a range inside another
        ([{"name": "all", "promptTokens": {}}, {"name": "mid", "promptTokens": {"min": 5,
          "max": 9}}], "speculative.classes[1].promptTokens", "5-9 tokens overlap"),
        # gap: 513-599 match nothing
        ([*FIELD_REPORT[:2], {"name": "long", "promptTokens": {"min": 600}}],
         "speculative.classes[2].promptTokens", "513-599"),
        # nothing below 10 and no default class
        ([{"name": "big", "promptTokens": {"min": 10}}], "speculative.classes[0].promptTokens",
         "0-9 tokens match no class"),
        # nothing above 127 and no default class
        ([FIELD_REPORT[0]], "speculative.classes[0].promptTokens", "above 127 tokens"),
        ([{"name": "bad", "promptTokens": {"min": 9, "max": 3}}],
         "speculative.classes[0].promptTokens", "min 9 is above max 3"),
        ([{"name": "a"}, {"name": "a", "header": {"name": "x", "value": "1"}}],
         "speculative.classes[1].name", "also speculative.classes[0]"),
        ([{"name": "a"}, {"name": "b"}], "speculative.classes[1]", "second default class"),
        ([{"name": "a", "header": {"name": "X-Tier", "value": "1"}},
          {"name": "b", "header": {"name": "x-tier", "value": "1"}}],
         "speculative.classes[1].header", "also speculative.classes[0]"),
        ([{"name": "a", "header": {"name": "x-class", "value": "v"},
           "promptTokens": {"max": 3}}], "speculative.classes[0]", "not both"),
        ([{"name": "a", "header": {"name": "x class", "value": "v"}}],
         "speculative.classes[0].header.name", "RFC 9110"),
        ([{"name": "a", "header": {"name": "x-class:", "value": "v"}}],
         "speculative.classes[0].header.name", "':'"),
        ([{"name": "a", "header": {"name": "x", "value": " padded"}}],
         "speculative.classes[0].header.value", "pattern"),
        ([{"name": "Long"}], "speculative.classes[0].name", "pattern"),
        ([{"name": "my-class"}], "speculative.classes[0].name", "pattern"),
        ([{"name": f"c{i}", "header": {"name": "x", "value": str(i)}}
          for i in range(classes_api.MAX_CLASSES + 1)],
         "speculative.classes", f"at most {classes_api.MAX_CLASSES}"),
        ([{"name": "a", "numSpeculativeTokens": 17}],
         "speculative.classes[0].numSpeculativeTokens", ""),
    ],
)
def test_bad_class_lists_are_refused_naming_the_field(classes, field, says):
    problems = _problems(classes)
    hits = [p for p in problems if p[0] == field and says in p[1]]
    assert hits, problems


def test_a_class_k_is_checked_as_the_resources_k_is():
    problems = _problems([{"name": "a", "numSpeculativeTokens": 5}], maxSpeculativeTokens=4)
    assert _fields(problems) == ["speculative.classes[0].numSpeculativeTokens"]
    problems = _problems([{"name": "a", "numSpeculativeTokens": 3}], mtpLayers=2)
    assert _fields(problems) == ["speculative.classes[0].numSpeculativeTokens"]
    # a class's own tuning is named by the class; an inherited one only by the resource
    problems = _problems([{"name": "a", "tuning": {"mode": "Auto", "candidates": [7]}}],
                         maxSpeculativeTokens=4)
    assert _fields(problems) == ["speculative.classes[0].tuning.candidates"]
    problems = _problems([{"name": "a"}], maxSpeculativeTokens=4,
                         tuning={"mode": "Auto", "candidates": [7]})
    assert _fields(problems) == ["speculative.tuning.candidates"]


def test_every_rfc9110_tchar_is_a_header_name():
    tchars = "!#$%&'*+-.^_`|~" + "0123456789" + "abcxyzABCXYZ"
    assert _problems([{"name": "a", "header": {"name": tchars, "value": "v"}}]) == []
    for ch in '"(),/:;<=>?@[\\]{} \t':
        problems = _problems([{"name": "a", "header": {"name": f"x{ch}y", "value": "v"}}])
        assert _fields(problems) == ["speculative.classes[0].header.name"], ch


def test_the_crd_keys_classes_by_name_and_carries_the_cel():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    classes = schema["properties"]["spec"]["properties"]["speculative"]["properties"]["classes"]
    assert classes["maxItems"] == classes_api.MAX_CLASSES
    assert classes["x-kubernetes-list-type"] == "map"
    assert classes["x-kubernetes-list-map-keys"] == ["name"]
    assert classes["items"]["required"] == ["name"]
    assert classes["x-kubernetes-validations"] == classes_api.CLASSES_CEL
    header = classes["items"]["properties"]["header"]["properties"]["name"]
    assert header["pattern"] == classes_api.HEADER_NAME_PATTERN
