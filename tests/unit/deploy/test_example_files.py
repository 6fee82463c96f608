"""examples/*.yaml: valid MTPInference objects that plan on every GPU the profile table knows, and
the seed example renders exactly the seed command. (tests/cluster/test_examples.py also sends
them to a real API server with the CRD installed: schema and CEL rules.)"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from mtp_operator.api.v1alpha1 import MTPInference
from mtp_operator.planning import plan_pool
from mtp_runtime.gpu_profiles import DEFAULT_PROFILES
from mtp_runtime.vllm_command import build_argv, build_env

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
PRODUCTS = [
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-H200",
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-L40S",
    "Tesla-T4",
    "NVIDIA-B200",
    "NVIDIA-RTX-PRO-6000",  # not in the table: the default K
]
SEED = (
    "vllm serve Qwen/Qwen3.6-27B --port 8000 --tensor-parallel-size 8 --max-model-len 262144 "
    "--reasoning-parser qwen3 "
    """--speculative-config '{"method":"qwen3_next_mtp","num_speculative_tokens":2}'"""
)


def _load(path: Path) -> dict:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert len(docs) == 1, f"{path.name}: one object per example"
    return docs[0]


def test_the_expected_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "qwen3.6-27b.yaml",
        "deepseek-v3-auto.yaml",
        "h100-h200-only.yaml",
        "speculation-off.yaml",
        "custom-profiles.yaml",
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_a_valid_resource(path: Path) -> None:
    doc = _load(path)
    assert "namespace" not in doc["metadata"], "examples must not pin a namespace"
    resource = MTPInference.model_validate(doc)
    name = doc["metadata"]["name"]
    # pool Services are named after the resource: a DNS-1035 label, no dots
    assert name.replace("-", "").isalnum() and name[0].isalpha() and len(name) <= 40
    for product in resource.spec.gpu_products or PRODUCTS:
        plan = plan_pool(resource.spec, product)
        build_argv(plan.serve)


def test_seed_example_renders_the_seed_command() -> None:
    spec = MTPInference.model_validate(_load(REPO / "examples" / "qwen3.6-27b.yaml")).spec
    for product in PRODUCTS:
        plan = plan_pool(spec, product)
        assert shlex.join(build_argv(plan.serve)) == SEED
        assert build_env(plan.serve) == {"VLLM_USE_MODELSCOPE": "true"}


def test_speculation_off_has_no_speculative_config() -> None:
    spec = MTPInference.model_validate(_load(REPO / "examples" / "speculation-off.yaml")).spec
    plan = plan_pool(spec, "NVIDIA-H100-80GB-HBM3")
    assert plan.k == 0 and plan.source == "off"
    assert "--speculative-config" not in build_argv(plan.serve)


def test_auto_example_follows_the_gpu() -> None:
    spec = MTPInference.model_validate(_load(REPO / "examples" / "deepseek-v3-auto.yaml")).spec
    ks = {p: plan_pool(spec, p).k for p in PRODUCTS}
    table = {p.family: p.k for p in DEFAULT_PROFILES}
    assert ks["NVIDIA-A100-SXM4-80GB"] == table["A100"]
    assert ks["NVIDIA-L40S"] == table["L40S"]
    assert ks["NVIDIA-H100-80GB-HBM3"] == min(table["H100"], 4)  # maxSpeculativeTokens
    assert len(set(ks.values())) > 1


def test_custom_profiles_example() -> None:
    spec = MTPInference.model_validate(_load(REPO / "examples" / "custom-profiles.yaml")).spec
    h100 = plan_pool(spec, "NVIDIA-H100-80GB-HBM3")
    h200 = plan_pool(spec, "NVIDIA-H200")
    l40s = plan_pool(spec, "NVIDIA-L40S")
    a100_40 = plan_pool(spec, "NVIDIA-A100-SXM4-40GB")
    assert (h100.k, h100.source) == (3, "override")
    assert (h200.k, h200.source) == (4, "cap")
    assert (l40s.k, l40s.source) == (0, "off")
    assert a100_40.source == "profile"  # the exact-product entry names the 80 GB card only
