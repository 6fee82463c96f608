"""validation.spec_problems: every invalid spec gives (field, message) pairs that name the
field and say what is wrong, from the pydantic models and from the operator's own checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.validation import problems_text, spec_problems

REPO = Path(__file__).resolve().parents[3]


def _with(**fields: Any) -> dict[str, Any]:
    return {"model": "org/model", **fields}


# (spec, field, text in the message)
INVALID: list[tuple[str, dict[str, Any], str, str]] = [
    # ---- the models (the API server's schema says the same) ----
    ("missing model", {}, "model", "Field required"),
    ("empty model", {"model": ""}, "model", "at least 1 character"),
    ("model not a string", {"model": 7}, "model", "valid string"),
    ("negative replicas", _with(replicas=-1), "replicas", "greater than or equal to 0"),
    ("replicas a word", _with(replicas="two"), "replicas", "valid integer"),
    ("replicas fractional", _with(replicas=1.5), "replicas", "valid integer"),
    ("tensorParallelSize 0", _with(tensorParallelSize=0), "tensorParallelSize",
     "greater than or equal to 1"),
    ("tensorParallelSize 65", _with(tensorParallelSize=65), "tensorParallelSize", "64"),
    ("modelSource enum", _with(modelSource="s3"), "modelSource", "'huggingface' or 'modelscope'"),
    ("maxModelLen a list", _with(maxModelLen=[1]), "maxModelLen", "valid"),
    ("gpuProducts a string", _with(gpuProducts="H100"), "gpuProducts", "valid list"),
    ("gpuProducts empty item", _with(gpuProducts=[""]), "gpuProducts[0]", "at least 1 character"),
    ("nodeSelector value", _with(nodeSelector={"strategy": 1}), "nodeSelector.strategy",
     "valid string"),
    ("env not a list", _with(env="HF_TOKEN=x"), "env", "valid list"),
    ("extraArgs not a list", _with(extraArgs="--enforce-eager"), "extraArgs", "valid list"),
    ("unknown field", _with(replica=2), "replica", "Extra inputs are not permitted"),
    ("K a word", _with(speculative={"numSpeculativeTokens": "many"}),
     "speculative.numSpeculativeTokens", "'auto'"),
    ("empty method", _with(speculative={"method": ""}), "speculative.method",
     "at least 1 character"),
    ("mtpLayers 0", _with(speculative={"mtpLayers": 0}), "speculative.mtpLayers",
     "greater than or equal to 1"),
    ("cap negative", _with(speculative={"maxSpeculativeTokens": -1}),
     "speculative.maxSpeculativeTokens", "greater than or equal to 0"),
    ("profile K a word", _with(speculative={"profiles": {"H100": "six"}}),
     "speculative.profiles.H100", "valid integer"),
    ("unknown speculative field", _with(speculative={"k": 2}), "speculative.k",
     "Extra inputs are not permitted"),
    ("hit rate above 1", _with(rollback={"minHitRate": 1.5}), "rollback.minHitRate",
     "less than or equal to 1"),
    ("cooldown negative", _with(rollback={"cooldownSeconds": -1}), "rollback.cooldownSeconds",
     "greater than or equal to 0"),
    ("enabled a word", _with(rollback={"enabled": "maybe"}), "rollback.enabled", "valid boolean"),
    ("window 0", _with(rollback={"windowSeconds": 0}), "rollback.windowSeconds",
     "greater than or equal to 1"),
    # spec.rollback.alertNames / alertMatchers (issue 36: which alerts may roll it back)
    ("alert name not a rollback rule", _with(rollback={"alertNames": ["HighLatency"]}),
     "rollback.alertNames[0]", "'MTPHitRateLow' or 'MTPErrorPropagationHigh'"),
    ("alert names empty", _with(rollback={"alertNames": []}), "rollback.alertNames",
     "at least 1 item"),
    ("alert name twice", _with(rollback={"alertNames": ["MTPHitRateLow", "MTPHitRateLow"]}),
     "rollback.alertNames", "must not name an alert twice"),
    ("matcher label not a label name", _with(rollback={"alertMatchers": {"team-name": "a"}}),
     "rollback.alertMatchers", "'team-name' is not a Prometheus label name"),
    ("matcher value not a string", _with(rollback={"alertMatchers": {"cluster": 1}}),
     "rollback.alertMatchers.cluster", "valid string"),
    ("matcher value too long", _with(rollback={"alertMatchers": {"cluster": "x" * 1025}}),
     "rollback.alertMatchers.cluster", "at most 1024 characters"),
    ("too many matchers", _with(rollback={"alertMatchers": {f"l{i}": "" for i in range(17)}}),
     "rollback.alertMatchers", "at most 16 items"),
    # ---- the operator's own checks (vLLM 0.33.0's rules) ----
    ("negative K", _with(speculative={"numSpeculativeTokens": -1}),
     "speculative.numSpeculativeTokens", "0 (off) or more"),
    ("non-MTP method", _with(speculative={"method": "eagle"}), "speculative.method",
     "'eagle' is not an MTP method vLLM 0.33.0 accepts"),
    ("ngram method", _with(speculative={"method": "ngram", "numSpeculativeTokens": 2}),
     "speculative.method", "not an MTP method"),
    ("K above the cap", _with(speculative={"numSpeculativeTokens": 5, "maxSpeculativeTokens": 4}),
     "speculative.numSpeculativeTokens", "5 exceeds speculative.maxSpeculativeTokens=4"),
    ("K not a multiple of the depth",
     _with(speculative={"numSpeculativeTokens": 3, "mtpLayers": 2}),
     "speculative.numSpeculativeTokens", "3 is not valid for a model with mtpLayers=2"),
    ("profile K not a multiple of the depth",
     _with(speculative={"mtpLayers": 2, "profiles": {"H100": 3}}),
     "speculative.profiles[H100]", "3 is not valid for a model with mtpLayers=2"),
    ("exact-product profile K", _with(speculative={"mtpLayers": 4, "profiles": {"NVIDIA-L40S": 6}}),
     "speculative.profiles[NVIDIA-L40S]", "multiple of it (4, 8, 12, ...), or at most 4"),
    ("negative profile K", _with(speculative={"profiles": {"T4": -1}}),
     "speculative.profiles[T4]", "0 (off) or more"),
    ("reserved --port", _with(extraArgs=["--port", "9000"]), "extraArgs[0]",
     "--port is set by the operator"),
    ("reserved --port=", _with(extraArgs=["--port=9000"]), "extraArgs[0]", "--port is set"),
    ("reserved -sc.method", _with(extraArgs=["-sc.method", "ngram"]), "extraArgs[0]",
     "-sc.method (-sc) is set by the operator"),
    ("reserved -tp", _with(extraArgs=["-tp", "2"]), "extraArgs[0]", "-tp is set"),
    ("reserved --speculative-config.", _with(extraArgs=["--speculative-config.method=ngram"]),
     "extraArgs[0]", "(--speculative-config)"),
    ("reserved with underscores", _with(extraArgs=["--max_model_len=8192"]), "extraArgs[0]",
     "--max_model_len (--max-model-len) is set by the operator"),
    ("reserved --served-model-name", _with(extraArgs=["--enforce-eager", "--served-model-name"]),
     "extraArgs[1]", "use the matching spec field instead"),
    ("abbreviated --tensor-parallel", _with(extraArgs=["--tensor-parallel=2"]), "extraArgs[0]",
     "--tensor-parallel (--tensor-parallel-size) is set"),
    ("two flags in one entry", _with(extraArgs=["--enforce-eager --port 9000"]), "extraArgs[0]",
     "--port is set"),
    ("pipeline parallelism", _with(extraArgs=["-pp", "2"]), "extraArgs[0]", "would break the pool"),
    ("data parallelism", _with(extraArgs=["--data_parallel_size=2"]), "extraArgs[0]",
     "(--data-parallel-size) would break the pool"),
    ("--model", _with(extraArgs=["--model", "other/model"]), "extraArgs[0]", "--model is set"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "field", "text"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_spec_names_the_field(spec: dict[str, Any], field: str, text: str) -> None:
    _, found = spec_problems(spec)
    assert found, f"{spec} passed validation"
    assert any(f == field and text in m for f, m in found), found
    for f, m in found:
        # clear messages: a field path, a sentence, no pydantic links or reprs
        assert f and not f.startswith(".") and ".." not in f
        assert m and "errors.pydantic.dev" not in m and "input_value" not in m
        assert "int." not in f and "literal[" not in f


def test_table_size() -> None:
    assert len(INVALID) >= 20
    assert len({c[0] for c in INVALID}) == len(INVALID)


def test_model_level_problems_return_no_spec_operator_level_ones_do() -> None:
    parsed, found = spec_problems({"replicas": -1})
    assert parsed is None and {f for f, _ in found} == {"model", "replicas"}
    parsed, found = spec_problems(_with(speculative={"method": "eagle"}))
    assert isinstance(parsed, MTPInferenceSpec) and found


def test_all_problems_reported_at_once_sorted_and_deduplicated() -> None:
    _, found = spec_problems({"replicas": -1, "tensorParallelSize": 0, "modelSource": "x"})
    assert [f for f, _ in found] == ["model", "modelSource", "replicas", "tensorParallelSize"]
    assert found == sorted(set(found))


@pytest.mark.parametrize("raw", ["a string", ["list"], 7])
def test_spec_that_is_not_an_object(raw: Any) -> None:
    assert spec_problems(raw) == (None, [("spec", f"must be an object, not {type(raw).__name__}")])


@pytest.mark.parametrize(
    "spec",
    [
        {"model": "m"},
        _with(speculative={"numSpeculativeTokens": 0, "method": "eagle"}),  # off: any method
        _with(speculative={"numSpeculativeTokens": 4, "mtpLayers": 2}),
        _with(speculative={"numSpeculativeTokens": 1, "mtpLayers": 2}),
        _with(speculative={"mtpLayers": 4}),  # table K lowered to fit, not an error
        _with(speculative={"maxSpeculativeTokens": 2, "profiles": {"H100": 6}}),  # capped
        _with(maxModelLen="32k", extraArgs=["--enforce-eager", "--gpu-memory-utilization=0.9"]),
        _with(extraArgs=["--port-range-note"]),  # only whole flag names are reserved
        _with(speculative={"method": "deepseek_mtp", "numSpeculativeTokens": "auto"}),
        _with(replicas=0),
    ],
)
def test_valid_specs(spec: dict[str, Any]) -> None:
    parsed, found = spec_problems(spec)
    assert found == [] and isinstance(parsed, MTPInferenceSpec)


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    assert spec_problems(yaml.safe_load(path.read_text())["spec"])[1] == []


def test_problems_text() -> None:
    assert problems_text([("model", "Field required"), ("replicas", "too low")]) == (
        "model: Field required; replicas: too low"
    )
    assert problems_text([]) == ""


# ---- pod parts: the user's own field path, never a failed apply --------------------------

POD_PARTS = [
    ("env without a name", _with(env=[{"name": "A", "value": "1"}, {"value": "x"}]),
     "env[1].name", "needs a name"),
    ("env duplicate", _with(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
     "env[1].name", "duplicate name A (also env[0])"),
    ("env the operator sets", _with(env=[{"name": "MTP_RUNTIME_CONFIG", "value": "{}"}]),
     "env[0].name", "set by the operator"),
    ("env modelscope switch", _with(env=[{"name": "VLLM_USE_MODELSCOPE", "value": "true"}]),
     "env[0].name", "modelSource"),
    ("env bad name", _with(env=[{"name": "A B", "value": "1"}]), "env[0].name",
     "not a valid environment variable name"),
    ("env value not a string", _with(env=[{"name": "A", "value": 3}]), "env[0].value",
     "string"),
    ("env value and valueFrom", _with(env=[{"name": "A", "value": "1",
                                              "valueFrom": {"fieldRef": {}}}]),
     "env[0]", "exclusive"),
    ("env unknown field", _with(env=[{"name": "A", "vaule": "1"}]), "env[0].vaule",
     "unknown field"),
    ("env not an object", _with(env=["A=1"]), "env[0]", "valid dictionary"),
    ("resources quantity", _with(resources={"limits": {"memory": "lots"}}),
     "resources.limits[memory]", "'lots' is not a quantity"),
    ("resources negative", _with(resources={"requests": {"cpu": -1}}),
     "resources.requests[cpu]", "not a quantity"),
    ("resources limits a string", _with(resources={"limits": "8Gi"}), "resources.limits",
     "map"),
    ("resources unknown key", _with(resources={"limit": {"cpu": "1"}}), "resources.limit",
     "unknown field"),
    ("toleration operator", _with(tolerations=[{"key": "k", "operator": "In"}]),
     "tolerations[0].operator", "Exists or Equal"),
    ("toleration effect", _with(tolerations=[{"key": "k", "effect": "Never"}]),
     "tolerations[0].effect", "NoSchedule"),
    ("toleration no key", _with(tolerations=[{"value": "v"}]), "tolerations[0].key",
     "required unless operator is Exists"),
    ("toleration Exists with value", _with(tolerations=[{"key": "k", "operator": "Exists",
                                                          "value": "v"}]),
     "tolerations[0].value", "empty"),
    ("toleration seconds", _with(tolerations=[{"key": "k", "effect": "NoSchedule",
                                               "tolerationSeconds": 5}]),
     "tolerations[0].tolerationSeconds", "NoExecute"),
    ("toleration not an object", _with(tolerations=["k=v:NoSchedule"]), "tolerations[0]",
     "valid dictionary"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "spec", "field", "text"), POD_PARTS,
                         ids=[c[0] for c in POD_PARTS])
def test_bad_pod_parts_are_invalid_spec_with_the_users_field_path(
    name: str, spec: dict[str, Any], field: str, text: str
) -> None:
    _, found = spec_problems(spec)
    assert any(f == field and text in m for f, m in found), found


def test_good_pod_parts_pass() -> None:
    spec = _with(
        env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}},
             {"name": "A", "value": ""}],
        resources={"limits": {"memory": "512Gi", "cpu": 32, "nvidia.com/gpu": "x"},
                   "requests": {"cpu": "500m", "ephemeral-storage": "1e3", "memory": "1.5Gi"}},
        tolerations=[{"operator": "Exists"}, {"key": "a", "operator": "Equal", "value": "b",
                                             "effect": "NoExecute", "tolerationSeconds": 30}],
    )
    assert spec_problems(spec)[1] == []
