"""A multi-node pool's argv (issue 38) through vLLM 0.33.0's own parser and engine config.

The runtime adds each pod's place in its LeaderWorkerSet group (mtp_runtime.multinode, from
LWS_LEADER_ADDRESS / LWS_GROUP_SIZE / LWS_WORKER_INDEX) to the pool's `vllm serve` line. Here
the leader's and a worker's full argv, as the runtime builds them, are parsed by vLLM's serve
parser (what each flag sets) and, on the tiny model with tensor 1 x pipeline 2 over 2 nodes,
turned into vLLM's engine config, which checks `--nnodes` against the world size and
`--node-rank` against `--nnodes`; a rank outside the group is refused by vLLM too.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mtp_runtime.multinode import MASTER_PORT, group_args, group_role
from mtp_runtime.vllm_command import ServeSettings, build_argv

pytestmark = pytest.mark.contract

HERE = Path(__file__).resolve().parent
TINY = HERE.parents[1] / "tests" / "fixtures" / "tiny-models" / "qwen3next-tiny"
LEADER = "deepseek-v3-h100-0.deepseek-v3-h100.ml"  # LWS: <lws>-<group>.<subdomain>.<ns>
DESTS = ["tensor_parallel_size", "pipeline_parallel_size", "nnodes", "node_rank",
         "master_addr", "master_port", "headless", "speculative_config"]


def _pod_argv(settings: ServeSettings, index: int) -> list[str]:
    env = {"LWS_LEADER_ADDRESS": LEADER, "LWS_GROUP_SIZE": str(settings.nnodes),
           "LWS_WORKER_INDEX": str(index)}
    return build_argv(settings) + group_args(group_role(env, settings.nnodes))


def _cases() -> list[dict[str, object]]:
    # DeepSeek-V3 on 2 nodes of 8 x H100 (spec.fit): tensor 8 x pipeline 2, as planned
    big = ServeSettings(model=str(TINY), num_speculative_tokens=4, tensor_parallel_size=8,
                        pipeline_parallel_size=2, nnodes=2, mtp_layers=1)
    tiny = ServeSettings(model=str(TINY), num_speculative_tokens=2, tensor_parallel_size=1,
                         pipeline_parallel_size=2, nnodes=2, mtp_layers=1)
    out: list[dict[str, object]] = []
    for index in (0, 1):
        out.append({"id": f"parse/{index}", "argv": _pod_argv(big, index), "engine": False,
                    "parse_only": True, "dests": DESTS})
        out.append({"id": f"engine/{index}", "argv": _pod_argv(tiny, index), "engine": True})
    bad = [*build_argv(tiny), "--node-rank", "2", "--master-addr", LEADER]  # rank 2 of 2
    out.append({"id": "engine/rank-outside", "argv": bad, "engine": True})
    return out


@pytest.fixture(scope="module")
def results(vllm_python: str, tmp_path_factory) -> dict[str, dict[str, object]]:
    out = tmp_path_factory.mktemp("multinode") / "results.json"
    proc = subprocess.run([str(vllm_python), str(HERE / "vllm_driver.py"), str(out)],
                          input=json.dumps({"cases": _cases()}), capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0 and out.exists(), proc.stderr[-5000:]
    doc = json.loads(out.read_text())
    assert doc["vllm_version"] == "0.33.0"
    return {r["id"]: r for r in doc["results"]}


@pytest.fixture(scope="module")
def vllm_python() -> str:
    import os
    import shutil

    python = os.environ.get("MTP_VLLM_PYTHON")
    if python:
        return python
    if shutil.which("bash") is None:
        pytest.skip("bash is needed for install_vllm.sh")
    proc = subprocess.run(["bash", str(HERE / "install_vllm.sh")], capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"install_vllm.sh failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("index", [0, 1])
def test_each_pod_sets_what_vllm_reads_for_its_rank(results, index: int) -> None:
    r = results[f"parse/{index}"]
    assert r["ok"], r
    v = r["values"]
    assert (v["tensor_parallel_size"], v["pipeline_parallel_size"], v["nnodes"]) == (8, 2, 2)
    assert (v["node_rank"], v["master_addr"], v["master_port"]) == (index, LEADER, MASTER_PORT)
    assert v["headless"] is (index != 0)  # the leader serves the API, workers run headless


@pytest.mark.parametrize("index", [0, 1])
def test_vllms_engine_config_takes_each_pods_line(results, index: int) -> None:
    r = results[f"engine/{index}"]
    assert r["ok"], f"{r['stage']}: {r['error_type']}: {r['error']}"
    assert r["speculative"] == {"method": "mtp", "num_speculative_tokens": 2}


def test_a_rank_outside_the_group_is_refused_by_vllm_and_by_us(results) -> None:
    r = results["engine/rank-outside"]
    assert not r["ok"] and "--node-rank" in str(r["error"]), r
    with pytest.raises(ValueError, match="LWS_WORKER_INDEX"):
        group_role({"LWS_LEADER_ADDRESS": LEADER, "LWS_GROUP_SIZE": "2",
                    "LWS_WORKER_INDEX": "2"}, 2)
