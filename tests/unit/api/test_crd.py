"""The MTPInference CRD: crds/ is exactly what the pydantic models generate, and the generated
schema says what the models say (fields, defaults, CEL rules, printer columns).

(tests/unit/deploy/test_chart_render.py checks that the chart's copy equals crds/; the CEL rules
themselves run on a real API server in tests/cluster/test_examples.py and test_reconcile.py.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from mtp_operator.api import crd as crdmod
from mtp_operator.api import v1alpha1 as api
from mtp_runtime.vllm_command import RESERVED_FLAGS, reserved_flags_in, reserved_pattern
from support.spellings import EXTRA_ARGS_ACCEPTED, EXTRA_ARGS_REFUSED

REPO = Path(__file__).resolve().parents[3]
CRD_FILE = REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"

CRD = crdmod.crd()
(VERSION,) = CRD["spec"]["versions"]
ROOT = VERSION["schema"]["openAPIV3Schema"]
SPEC = ROOT["properties"]["spec"]
STATUS = ROOT["properties"]["status"]


def test_crds_file_is_the_generated_crd() -> None:
    assert CRD_FILE.read_text() == crdmod.crd_yaml(), (
        "crds/mtp-operator.io_mtpinferences.yaml is out of date with "
        "operator/mtp_operator/api/v1alpha1.py: regenerate it with `make crds` (that is, "
        "`mtp-operator crd > crds/mtp-operator.io_mtpinferences.yaml` and a copy to "
        "charts/mtp-operator/crds/)"
    )
    assert yaml.safe_load(CRD_FILE.read_text()) == CRD


def test_names_scope_and_version() -> None:
    assert CRD["metadata"]["name"] == "mtpinferences.mtp-operator.io"
    spec = CRD["spec"]
    assert spec["group"] == "mtp-operator.io" and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "MTPInference",
        "listKind": "MTPInferenceList",
        "plural": "mtpinferences",
        "singular": "mtpinference",
        "shortNames": ["mtpi"],
        "categories": ["all", "mtp"],
    }
    assert VERSION["name"] == "v1alpha1" and VERSION["served"] and VERSION["storage"]
    assert VERSION["subresources"] == {"status": {}}
    assert ROOT["required"] == ["spec"]


def test_printer_columns() -> None:
    cols = VERSION["additionalPrinterColumns"]
    assert [(c["name"], c["type"], c["jsonPath"]) for c in cols] == [
        ("Model", "string", ".spec.model"),
        ("Pools", "string", ".status.poolsSummary"),
        ("Recommended", "string", ".status.tuningSummary"),
        ("Ready", "string", ".status.ready"),
        ("Phase", "string", ".status.phase"),
        ("Age", "date", ".metadata.creationTimestamp"),
        ("Fit", "string", ".status.fitSummary"),  # -o wide (priority 1)
    ]
    assert [c["name"] for c in cols if c.get("priority")] == ["Fit"]
    # every column points at a field the schema has
    for col in cols[:-2] + cols[-1:]:
        _, part, field = col["jsonPath"].split(".")
        assert field in ROOT["properties"][part]["properties"], col


# ---- the schema follows the pydantic models ------------------------------------------------


def _aliases(model: type[BaseModel]) -> dict[str, Any]:
    return {f.alias or name: f for name, f in model.model_fields.items()}


NESTED = {
    (api.MTPInferenceSpec, "speculative"): api.SpeculativeSpec,
    (api.MTPInferenceSpec, "rollback"): api.RollbackSpec,
    (api.MTPInferenceStatus, "conditions"): api.Condition,
    (api.MTPInferenceStatus, "pools"): api.PoolStatus,
    (api.MTPInferenceStatus, "rollbacks"): api.RollbackRecord,
}


def _walk(model: type[BaseModel], schema: dict[str, Any], path: str) -> list[str]:
    """Fields of `model` (camelCase) missing from `schema`, or extra in it, recursively."""
    wrong: list[str] = []
    fields = _aliases(model)
    props = schema["properties"]
    wrong += [f"{path}.{n}: missing" for n in fields if n not in props]
    wrong += [f"{path}.{n}: not in the model" for n in props if n not in fields]
    for name in fields.keys() & props.keys():
        nested = NESTED.get((model, name))
        if nested is not None:
            sub = props[name]
            sub = sub["items"] if sub.get("type") == "array" else sub
            wrong += _walk(nested, sub, f"{path}.{name}")
    return wrong


@pytest.mark.parametrize(
    ("model", "schema", "path"),
    [(api.MTPInferenceSpec, SPEC, "spec"), (api.MTPInferenceStatus, STATUS, "status")],
    ids=["spec", "status"],
)
def test_every_model_field_is_in_the_schema(model, schema, path) -> None:
    assert _walk(model, schema, path) == []


def test_field_names_are_camel_case() -> None:
    def names(schema: dict[str, Any]) -> list[str]:
        out = []
        for name, sub in (schema.get("properties") or {}).items():
            out.append(name)
            out += names(sub.get("items", sub))
        return out

    for name in names(SPEC) + names(STATUS):
        assert "_" not in name and name[0].islower(), name
    assert {"tensorParallelSize", "maxModelLen", "extraArgs", "gpuProducts"} <= SPEC[
        "properties"
    ].keys()
    assert {"numSpeculativeTokens", "maxSpeculativeTokens", "mtpLayers"} <= SPEC["properties"][
        "speculative"
    ]["properties"].keys()


def test_required_fields() -> None:
    assert SPEC["required"] == ["model"]
    assert SPEC["properties"]["model"]["minLength"] == 1
    pool = STATUS["properties"]["pools"]["items"]
    assert set(pool["required"]) == {"gpuProduct", "numSpeculativeTokens", "source", "deployment"}


def test_defaults() -> None:
    props = SPEC["properties"]
    spec_defaults = {k: v.get("default") for k, v in props.items() if "default" in v}
    assert spec_defaults == {
        "modelSource": "huggingface",
        "replicas": 1,
        "tensorParallelSize": 1,
        "hostNetwork": False,
        "speculative": {},
        "rollback": {},
    }
    spec = props["speculative"]["properties"]
    assert spec["method"]["default"] == "mtp"
    assert spec["numSpeculativeTokens"]["default"] == "auto"
    rollback = {k: v["default"] for k, v in props["rollback"]["properties"].items()
                if "default" in v}
    assert rollback == {
        "enabled": True,
        "minHitRate": api.DEFAULT_MIN_HIT_RATE,
        "maxErrorPropagationRate": api.DEFAULT_MAX_ERROR_PROPAGATION_RATE,
        "cooldownSeconds": 600,
        "stabilizationSeconds": 600,
        "windowSeconds": 300,
        "forSeconds": 300,
        "minDrafts": 50,
        "alertNames": ["MTPHitRateLow", "MTPErrorPropagationHigh"],
    }
    assert "default" not in props["rollback"]["properties"]["alertMatchers"]  # none: no match
    assert (rollback["minHitRate"], rollback["maxErrorPropagationRate"]) == (0.88, 0.40)
    # the API server's defaults are the models' defaults
    parsed = api.MTPInferenceSpec(model="m").model_dump(by_alias=True)
    assert {k: parsed[k] for k in ("modelSource", "replicas", "tensorParallelSize")} == {
        k: spec_defaults[k] for k in ("modelSource", "replicas", "tensorParallelSize")
    }
    assert {k: v for k, v in parsed["rollback"].items() if v is not None} == rollback
    assert (parsed["speculative"]["method"], parsed["speculative"]["numSpeculativeTokens"]) == (
        "mtp",
        "auto",
    )


def test_bounds_and_enums() -> None:
    props = SPEC["properties"]
    assert props["replicas"]["minimum"] == 0
    assert (props["tensorParallelSize"]["minimum"], props["tensorParallelSize"]["maximum"]) == (
        1,
        64,
    )
    assert props["modelSource"]["enum"] == ["huggingface", "modelscope"]
    assert props["gpuProducts"]["maxItems"] == 64
    assert props["extraArgs"]["maxItems"] == 128
    assert props["nodeSelector"]["additionalProperties"] == {"type": "string"}
    spec = props["speculative"]["properties"]
    assert spec["mtpLayers"]["minimum"] == 1 and spec["maxSpeculativeTokens"]["minimum"] == 0
    assert spec["profiles"]["additionalProperties"] == {"type": "integer", "maximum": 16}
    for name in ("minHitRate", "maxErrorPropagationRate"):
        r = props["rollback"]["properties"][name]
        assert (r["minimum"], r["maximum"]) == (0, 1)
    status = STATUS["properties"]
    assert status["rollbacks"]["maxItems"] == api.MAX_ROLLBACK_HISTORY == 20
    assert status["phase"]["enum"] == ["Pending", "Progressing", "Ready", "Degraded", "Invalid"]
    assert status["pools"]["items"]["properties"]["source"]["enum"] == [
        "profile",
        "override",
        "cap",
        "rollback",
        "off",
        "tuned",
    ]
    tuning = spec["tuning"]["properties"]
    assert tuning["mode"]["enum"] == ["Off", "Recommend", "Auto"]
    assert tuning["mode"]["default"] == "Off" and spec["tuning"]["default"] == {}
    assert tuning["minGain"]["default"] == 0.05
    assert (tuning["minGain"]["minimum"], tuning["minGain"]["maximum"]) == (0, 1)
    assert tuning["candidates"]["items"]["minimum"] == 0
    assert tuning["candidates"]["x-kubernetes-list-type"] == "set"
    assert tuning["observationSeconds"]["minimum"] == 5
    assert tuning["maxTrialsPerDay"]["minimum"] == 0
    assert tuning["revisitSeconds"]["default"] == 6 * 3600
    assert (tuning["revisitSeconds"]["minimum"], tuning["revisitSeconds"]["maximum"]) == (
        0, 7 * 86400)
    assert tuning["trialWindows"]["default"] == 3
    assert (tuning["trialWindows"]["minimum"], tuning["trialWindows"]["maximum"]) == (1, 12)


def test_int_or_string_fields() -> None:
    for schema in (
        SPEC["properties"]["maxModelLen"],
        SPEC["properties"]["speculative"]["properties"]["numSpeculativeTokens"],
    ):
        assert schema.get("x-kubernetes-int-or-string") is True and "type" not in schema


def test_schema_is_structural() -> None:
    """What the API server demands of a CRD schema: no refs/unions, a type on every node
    (or int-or-string / preserve-unknown-fields), items on every array."""

    def check(node: dict[str, Any], path: str) -> None:
        for key in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "nullable", "title", "const"):
            assert key not in node, f"{path}: {key}"
        if not (
            node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ):
            assert node.get("type") in {
                "object",
                "array",
                "string",
                "integer",
                "number",
                "boolean",
            }, path
        if node.get("type") == "array":
            check(node["items"], path + "[]")
        for name, sub in (node.get("properties") or {}).items():
            check(sub, f"{path}.{name}")
        if isinstance(node.get("additionalProperties"), dict):
            check(node["additionalProperties"], path + "{}")

    check(ROOT, "")


# ---- CEL ------------------------------------------------------------------------------------


def _rules(schema: dict[str, Any]) -> list[dict[str, str]]:
    return schema.get("x-kubernetes-validations") or []


def test_cel_rules_are_where_they_belong() -> None:
    spec_rules = _rules(SPEC)
    assert spec_rules == api.SPEC_CEL_RULES and len(spec_rules) == 3
    cap, depth, candidates = spec_rules
    assert candidates["fieldPath"] == ".speculative.tuning.candidates"
    assert "candidates.all(k, k <= self.speculative.maxSpeculativeTokens)" in candidates["rule"]
    spec_rules = [cap, depth]
    assert "maxSpeculativeTokens" in cap["rule"] and "maxSpeculativeTokens" in cap["message"]
    assert "mtpLayers" in depth["rule"] and "% self.speculative.mtpLayers" in depth["rule"]
    for rule in spec_rules:
        assert rule["fieldPath"] == ".speculative.numSpeculativeTokens"
        assert rule["reason"] == "FieldValueInvalid"
        # an int-or-string field: the integer comparisons are guarded by a type check
        assert "type(self.speculative.numSpeculativeTokens) == string" in rule["rule"]

    (k_rule,) = _rules(SPEC["properties"]["speculative"]["properties"]["numSpeculativeTokens"])
    assert "'auto'" in k_rule["rule"] and "0" in k_rule["message"]
    (len_rule,) = _rules(SPEC["properties"]["maxModelLen"])
    assert "matches(" in len_rule["rule"] and "32k" in len_rule["message"]
    (profile_rule,) = _rules(SPEC["properties"]["speculative"]["properties"]["profiles"])
    assert ">= 0" in profile_rule["rule"]
    assert all(r["message"] for r in [*spec_rules, k_rule, len_rule, profile_rule])


def _cel_regex(rule: str) -> re.Pattern[str]:
    """The regex inside `self.all(a, !a.matches('...'))`, CEL string escapes undone."""
    m = re.fullmatch(r"self\.all\(a, !a\.matches\('(.*)'\)\)", rule)
    assert m, rule
    return re.compile(re.sub(r"\\(.)", r"\1", m.group(1)))


def test_extra_args_rule_is_generated_from_the_operators_own_list() -> None:
    """The API server and the operator refuse the same flags, in every spelling."""
    (rule,) = _rules(SPEC["properties"]["extraArgs"])
    cel = _cel_regex(rule["rule"])
    assert cel.pattern == reserved_pattern()
    for flag in RESERVED_FLAGS:
        assert flag in rule["message"]
    for arg in EXTRA_ARGS_REFUSED:
        assert cel.search(arg), arg
        assert reserved_flags_in(arg), arg
    for arg in EXTRA_ARGS_ACCEPTED:
        assert not cel.search(arg), arg
        assert not reserved_flags_in(arg), arg
