"""tests/support/real_pool.py's launch for a pool pod: the operator's own pod spec, with only the
documented substitutions, planned by the real runtime into the `vllm serve` argv it would run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mtp_operator import builders
from mtp_operator.api.v1alpha1 import MTPInference
from mtp_operator.planning import plan_pool
from mtp_runtime import gpu_detect
from mtp_runtime.launcher import plan
from mtp_runtime.pool_config import ENV_VAR, PoolConfig
from support.real_pool import runtime_launch

REPO = Path(__file__).resolve().parents[3]
L40S = "NVIDIA-L40S"
TINY = "/cache/models/tiny-mimo"
IP = "127.64.0.7"


def pod_for(example: str, product: str, rollback_k: int | None = None) -> dict:
    """The pod a ReplicaSet would make from the operator's Deployment for this pool."""
    obj = MTPInference.model_validate(yaml.safe_load((REPO / "examples" / example).read_text()))
    spec = obj.spec
    deployment = builders.pool_deployment(
        "deepseek-v3", "ns", "uid-1", spec, plan_pool(spec, product, rollback_k=rollback_k),
        "img:1")
    template = deployment["spec"]["template"]
    return {"metadata": {"name": "deepseek-v3-l40s-abc", **template["metadata"]},
            "spec": template["spec"], "status": {"podIP": IP}}


def test_only_model_parallelism_context_parser_and_host_change():
    pod = pod_for("deepseek-v3-auto.yaml", L40S)
    launch = runtime_launch(pod, TINY)
    rendered_env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert launch.rendered == PoolConfig.from_json(rendered_env[ENV_VAR])
    assert launch.substitutions == {
        "serve.model": ("deepseek-ai/DeepSeek-V3", TINY),
        "serve.tensor_parallel_size": (8, 1),
        "serve.max_model_len": ("65536", None),
        "serve.extra_args": ((), ("--host", IP)),
    }
    # everything else the operator decided is handed over as rendered
    before, after = launch.rendered, launch.config
    for name in ("num_speculative_tokens", "method", "port", "served_model_name",
                 "model_source", "mtp_layers"):
        assert getattr(after.serve, name) == getattr(before.serve, name), name
    assert (after.gpu_product, after.k_mode, after.profiles, after.max_speculative_tokens) == (
        before.gpu_product, before.k_mode, before.profiles, before.max_speculative_tokens)
    assert launch.k == 2  # L40S profile
    assert {k: v for k, v in launch.env.items() if k != ENV_VAR} == {
        **{k: v for k, v in rendered_env.items() if k != ENV_VAR}, "MTP_RUNTIME_DEVICE": "cpu"}
    assert json.loads(launch.env[ENV_VAR]) == json.loads(after.to_json())


def test_the_pod_command_is_run_with_kubelet_side_flags_only():
    launch = runtime_launch(pod_for("deepseek-v3-auto.yaml", L40S), TINY)
    assert launch.argv[:2] == ["mtp-runtime", "serve"]  # the container's command
    flags = launch.argv[2:]
    assert dict(zip(flags[::2], flags[1::2], strict=True)) == {
        "--exporter-host": IP, "--exporter-port": "9400",
        "--vllm-metrics-url": f"http://{IP}:8000/metrics", "--window": "10",
        "--scrape-interval": "1"}


@pytest.mark.parametrize("rollback_k", [None, 1])
def test_the_runtime_plans_the_operators_k_for_the_tiny_model(rollback_k):
    launch = runtime_launch(pod_for("deepseek-v3-auto.yaml", L40S, rollback_k), TINY)
    argv = plan(launch.config, gpu_detect.assumed(L40S)).argv
    k = rollback_k or 2
    assert argv[:3] == ["vllm", "serve", TINY]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert "--max-model-len" not in argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "mtp", "num_speculative_tokens": k}
    assert argv[-2:] == ["--host", IP]


def test_a_pod_without_ip_or_config_is_refused():
    pod = pod_for("deepseek-v3-auto.yaml", L40S)
    with pytest.raises(ValueError, match="no pod IP"):
        runtime_launch({**pod, "status": {}}, TINY)
    container = {**pod["spec"]["containers"][0], "env": []}
    with pytest.raises(ValueError, match=ENV_VAR):
        runtime_launch({**pod, "spec": {**pod["spec"], "containers": [container]}}, TINY)
