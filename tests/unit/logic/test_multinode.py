"""Multi-node replicas (issue 38): each pod's flags from the LeaderWorkerSet environment
(mtp_runtime.multinode), the pool's vllm line over nodes, and the pool's LeaderWorkerSet
(mtp_operator.lws). tests/contract/test_multinode_contract.py runs the same argv through
vLLM 0.33.0's parser and engine config."""

from __future__ import annotations

import json

import pytest

from mtp_operator import builders
from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.lws import observe_leaderworkerset, pool_leaderworkerset
from mtp_operator.naming import ANNOTATION_COMMAND
from mtp_operator.planning import GPUNode, plan_pool, product_fits
from mtp_runtime.multinode import MASTER_PORT, GroupError, group_args, group_role
from mtp_runtime.vllm_command import ServeSettings, build_argv, problems

pytestmark = pytest.mark.unit

H100 = "NVIDIA-H100-80GB-HBM3"
LEADER = "ds-h100-0.ds-h100.ml"


def _env(index: int, size: int = 2, leader: str = LEADER) -> dict[str, str]:
    return {"LWS_LEADER_ADDRESS": leader, "LWS_GROUP_SIZE": str(size),
            "LWS_WORKER_INDEX": str(index)}


def test_leader_and_workers_get_their_rank_and_the_leaders_address() -> None:
    lead = ["--node-rank", "0", "--master-addr", LEADER, "--master-port", str(MASTER_PORT)]
    assert group_args(group_role(_env(0, 3), 3)) == lead
    for i in (1, 2):
        args = group_args(group_role(_env(i, 3), 3))
        assert args[:2] == ["--node-rank", str(i)] and args[-1] == "--headless"
        assert args[2:6] == lead[2:]
    assert group_role(_env(0), 1) is None and group_args(None) == []  # one node: no flags


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({}, "LWS_LEADER_ADDRESS"),
        (_env(0, size=3), "LWS_GROUP_SIZE"),  # the pool wants 2 pods a group
        (_env(2), "LWS_WORKER_INDEX"),
        ({**_env(0), "LWS_WORKER_INDEX": "x"}, "LWS_WORKER_INDEX"),
    ],
)
def test_a_pod_outside_a_fitting_group_is_refused_naming_the_variable(env, name) -> None:
    with pytest.raises(GroupError) as err:
        group_role(env, 2)
    assert name in [p.field for p in err.value.problems]


def test_serve_line_over_nodes_and_its_hash_stays_for_one_node() -> None:
    one = ServeSettings(model="org/m", num_speculative_tokens=2, tensor_parallel_size=8)
    assert "pipeline_parallel_size" not in json.loads(one.to_json())  # old hashes unchanged
    two = ServeSettings(model="org/m", num_speculative_tokens=2, tensor_parallel_size=8,
                        pipeline_parallel_size=2, nnodes=2)
    argv = build_argv(two)
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert ServeSettings.from_json(two.to_json()) == two
    odd = ServeSettings(model="org/m", num_speculative_tokens=2, tensor_parallel_size=3,
                        nnodes=2)
    assert [p.field for p in problems(odd)] == ["fit"]  # 3 GPUs do not split over 2 nodes


def _plan(weights: float = 652):
    spec = MTPInferenceSpec.model_validate(
        {"model": "deepseek-ai/DeepSeek-V3", "tensorParallelSize": 8, "replicas": 2,
         "fit": {"weightsGiB": weights}})
    nodes = [GPUNode(f"h{i}", H100, 8, {"nvidia.com/gpu.memory": "81559"}, True, 8)
             for i in range(4)]
    fit = product_fits(spec, nodes)[H100]
    return spec, plan_pool(spec, H100, fit=fit)


def test_a_two_node_pool_is_a_leaderworkerset_of_the_pools_own_pod() -> None:
    spec, plan = _plan()
    assert plan.nodes == 2 and plan.fit is not None and plan.fit.gpus_per_pod == 8
    deploy = builders.pool_deployment("ds", "ml", "uid-1", spec, plan, "img:1")
    lws = pool_leaderworkerset(deploy, plan.nodes, plan.fit.gpus_per_pod)
    assert (lws["apiVersion"], lws["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert lws["metadata"] == deploy["metadata"]  # name, labels, owner, command, hash, product
    argv = json.loads(lws["metadata"]["annotations"][ANNOTATION_COMMAND])
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    group = lws["spec"]["leaderWorkerTemplate"]
    assert lws["spec"]["replicas"] == 2 and group["size"] == 2
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    for template in (leader, worker):
        (container,) = template["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert container["command"] == deploy["spec"]["template"]["spec"]["containers"][0][
            "command"]
    assert "readinessProbe" not in worker["spec"]["containers"][0]
    assert leader["spec"]["containers"][0].get("readinessProbe") == (
        deploy["spec"]["template"]["spec"]["containers"][0].get("readinessProbe"))
    assert deploy["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] == "8"  # the Deployment it came from is not changed


def test_a_one_node_plan_has_no_group() -> None:
    spec, plan = _plan(weights=100)
    assert plan.nodes == 1 and "--nnodes" not in build_argv(plan.serve)
    deploy = builders.pool_deployment("ds", "ml", "uid-1", spec, plan, "img:1")
    with pytest.raises(ValueError, match="2 or more nodes"):
        pool_leaderworkerset(deploy, 1, 8)


def test_group_counts_as_a_deployments() -> None:
    body = {"spec": {"replicas": 2},
            "status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}}
    assert observe_leaderworkerset(body) == (2, 1, True)
    body["status"]["updatedReplicas"] = 1
    assert observe_leaderworkerset(body) == (2, 1, False)
