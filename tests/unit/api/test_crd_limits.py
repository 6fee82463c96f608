"""Every numeric bound of the generated CRD that stands for a limit in code equals that
constant, so the API server refuses exactly what the operator refuses (issue 36: tuning
candidates were accepted up to 64 while K stops at 16)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtp_operator.api import tuning as tuning_api
from mtp_operator.api import v1alpha1 as api
from mtp_runtime.vllm_command import MAX_SPECULATIVE_TOKENS

REPO = Path(__file__).resolve().parents[3]
CRD_FILE = REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"
(VERSION,) = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"]
ROOT = VERSION["schema"]["openAPIV3Schema"]

K = MAX_SPECULATIVE_TOKENS


def _walk(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, schema) for every node: `a.b` properties, `a[]` items, `a{}` map values."""
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


NODES = dict(_walk(ROOT, ""))

# (path, bound, constant)
LIMITS = [
    ("spec.speculative.maxSpeculativeTokens", "maximum", K),
    ("spec.speculative.profiles{}", "maximum", K),
    ("spec.speculative.tuning.candidates[]", "maximum", K),
    # a set of the K 0..16: at most 17 of them
    ("spec.speculative.tuning.candidates", "maxItems", K + 1),
    ("spec.speculative.batchSizeSchedule[].numSpeculativeTokens", "maximum", K),
    ("spec.speculative.mtpLayers", "maximum", api.MAX_MTP_LAYERS),
    ("spec.replicas", "maximum", api.INT32_MAX),
    ("spec.env", "maxItems", api.MAX_ENV),
    ("spec.tolerations", "maxItems", api.MAX_TOLERATIONS),
    ("spec.extraArgs[]", "maxLength", api.MAX_EXTRA_ARG_LENGTH),
    ("spec.rollback.cooldownSeconds", "maximum", api.MAX_DURATION_SECONDS),
    ("spec.rollback.stabilizationSeconds", "maximum", api.MAX_DURATION_SECONDS),
    ("spec.rollback.windowSeconds", "maximum", api.MAX_DURATION_SECONDS),
    ("spec.rollback.forSeconds", "maximum", api.MAX_DURATION_SECONDS),
    ("spec.rollback.minDrafts", "maximum", api.INT32_MAX),
    ("spec.rollback.alertNames", "maxItems", len(api.ROLLBACK_ALERT_NAMES)),
    ("spec.rollback.alertNames", "minItems", 1),
    ("spec.rollback.alertMatchers", "maxProperties", api.MAX_ALERT_MATCHERS),
    ("spec.rollback.alertMatchers{}", "maxLength", api.MAX_ALERT_MATCHER_VALUE_LENGTH),
    ("status.rollbacks", "maxItems", api.MAX_ROLLBACK_HISTORY),
    ("status.pools[].tuning.measured", "maxItems", tuning_api.MAX_TUNING_ROWS),
    ("status.pools[].tuning.estimates", "maxItems", tuning_api.MAX_TUNING_ROWS),
    ("status.pools[].tuning.trials", "maxItems", tuning_api.MAX_TRIAL_HISTORY),
]


def test_k_is_capped_at_16() -> None:
    # the shipped Prometheus rules compute error propagation for K <= 16
    assert MAX_SPECULATIVE_TOKENS == 16


@pytest.mark.parametrize(("path", "bound", "constant"), LIMITS, ids=[x[0] for x in LIMITS])
def test_schema_bound_is_the_codes_constant(path: str, bound: str, constant: int) -> None:
    assert path in NODES, f"{path} is not in the CRD"
    assert NODES[path].get(bound) == constant, f"{path} {bound}"


def _cel_maximum(schema: dict[str, Any]) -> int | None:
    for rule in schema.get("x-kubernetes-validations") or ():
        m = re.search(r"self(?:\[k\])? <= (\d+)", rule["rule"])
        if m:
            return int(m.group(1))
    return None


def test_num_speculative_tokens_rule_says_16() -> None:
    # int or `auto`: the bound is in its CEL rule
    node = NODES["spec.speculative.numSpeculativeTokens"]
    assert node.get("x-kubernetes-int-or-string") is True
    assert _cel_maximum(node) == K
    assert _cel_maximum(NODES["spec.speculative.profiles"]) == K


def test_every_k_in_the_spec_is_bounded_by_k_max() -> None:
    """A K field added later without the bound fails here."""
    k_fields = [
        p for p in NODES
        if p.startswith("spec.") and (
            p.endswith("SpeculativeTokens") or p.startswith("spec.speculative.profiles{")
            or p == "spec.speculative.tuning.candidates[]"
        )
    ]
    assert len(k_fields) >= 5, k_fields
    for path in k_fields:
        node = NODES[path]
        assert node.get("maximum", _cel_maximum(node)) == K, path
        assert node.get("minimum", 0) == 0 or _cel_maximum(node) == K, path



def test_alert_names_are_the_rollback_rules_and_matchers_prometheus_label_names() -> None:
    """spec.rollback.alertNames takes exactly the names the webhook acts on (any other is
    `not_rollback_alert` before a resource is looked at), once each; the matchers' keys are
    checked by CEL with the pattern the operator's validation uses."""
    from mtp_operator.rollback.signals import ROLLBACK_ALERTS

    names = NODES["spec.rollback.alertNames"]
    assert set(names["items"]["enum"]) == set(ROLLBACK_ALERTS)
    assert names["x-kubernetes-list-type"] == "set"
    assert names["default"] == list(api.ROLLBACK_ALERT_NAMES)
    (rule,) = NODES["spec.rollback.alertMatchers"]["x-kubernetes-validations"]
    assert api.LABEL_NAME_PATTERN in rule["rule"]
