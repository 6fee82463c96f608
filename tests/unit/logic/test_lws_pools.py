"""Multi-node pools applied as LeaderWorkerSets (issue 38): the reconciler creates, leaves
alone, reverts, rolls back, changes the kind of, and removes them through the same paths as
Deployment pools; the tuner leaves them alone. Over the in-memory cluster (fake_cluster)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest

from mtp_operator.api.tuning import PoolTuningStatus, TuningTrial
from mtp_operator.api.v1alpha1 import MTPInferenceSpec, MTPInferenceStatus
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.control.rollback import RollbackActions
from mtp_operator.lws import LABEL_GROUP_ROLE, SERVING_LABELS
from mtp_operator.naming import ANNOTATION_COMMAND, GPU_RESOURCE
from mtp_operator.planning import GPUNode
from mtp_operator.reconcile_plan import plan_pass
from mtp_operator.rollback.signals import AlertSignal, PoolRef
from mtp_operator.settings import OperatorSettings
from mtp_operator.tuning.state import canary_plans
from mtp_runtime.pool_config import PoolConfig
from support.fake_cluster import FakeKube, FakeView, mtpinference

pytestmark = pytest.mark.unit

H200, H100 = "NVIDIA-H200", "NVIDIA-H100-80GB-HBM3"
MIB = {H200: 143771, H100: 81559}  # nvidia-smi memory.total, as GPU Feature Discovery labels
WEIGHTS_GIB, HEADROOM, TP, GPUS = 652.0, 0.2, 8, 8
KEY = ("ml", "ds")
T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def nodes_needed(product: str) -> int:
    """Nodes of GPUS GPUs one replica needs: the weights over the usable memory of a node."""
    usable = GPUS * MIB[product] / 1024 * (1 - HEADROOM)
    return math.ceil(WEIGHTS_GIB / usable)


def gpu_nodes(products: dict[str, int]) -> list[GPUNode]:
    return [
        GPUNode(f"{p}-{i}", p, GPUS,
                {"nvidia.com/gpu.product": p, "nvidia.com/gpu.memory": str(MIB[p])}, True, GPUS)
        for p, count in products.items() for i in range(count)
    ]


def spec(**extra: Any) -> dict[str, Any]:
    return {
        "model": "deepseek-ai/DeepSeek-V3",
        "tensorParallelSize": TP,
        "fit": {"weightsGiB": WEIGHTS_GIB, "headroom": HEADROOM, "maxNodesPerReplica": 2},
        **extra,
    }


def k_of(pool: dict[str, Any]) -> int:
    argv = json.loads(pool["metadata"]["annotations"][ANNOTATION_COMMAND])
    config = argv[argv.index("--speculative-config") + 1]
    return json.loads(config)["num_speculative_tokens"]


def argv_of(template: dict[str, Any]) -> list[str]:
    container = template["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    return [*container["command"], env.get("MTP_RUNTIME_CONFIG", "")]


async def rolled_out(products: dict[str, int], **extra: Any):
    kube, view = FakeKube(), FakeView(nodes=gpu_nodes(products))
    view.add(mtpinference("ds", spec(**extra)))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    return kube, view, rec


def test_the_worked_figures_hold() -> None:
    # H100: 8 x 79.6 GiB x 0.8 = 509.8 < 652 -> 2 nodes; H200: 8 x 140.4 x 0.8 = 898.6 -> 1
    assert (nodes_needed(H100), nodes_needed(H200)) == (2, 1)


async def test_a_multi_node_product_gets_a_leaderworkerset_pool() -> None:
    kube, _view, rec = await rolled_out({H100: 2, H200: 1})
    lws = kube.leaderworkersets()
    assert set(lws) == {H100} and set(kube.deployments()) == {H200}
    pool = lws[H100]
    size = nodes_needed(H100)
    assert pool["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert pool["spec"]["leaderWorkerTemplate"]["size"] == size
    assert pool["spec"]["replicas"] == 1  # groups: spec.replicas
    owner = pool["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("MTPInference", "ds", True)
    leader = pool["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    worker = pool["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    for template in (leader, worker):  # each pod takes a whole node
        limits = template["spec"]["containers"][0]["resources"]["limits"]
        assert limits[GPU_RESOURCE] == str(GPUS)
    # pipeline stages x tensor = GPUs of the group
    argv = json.loads(pool["metadata"]["annotations"][ANNOTATION_COMMAND])
    pp = int(argv[argv.index("--pipeline-parallel-size") + 1])
    assert pp * TP == size * GPUS and argv[argv.index("--nnodes") + 1] == str(size)
    # the Service, the InferencePool and the pod index select serving pods: no worker
    assert not set(SERVING_LABELS) & set(worker["metadata"]["labels"])
    assert worker["metadata"]["labels"][LABEL_GROUP_ROLE] == "worker"
    assert all(k in leader["metadata"]["labels"] for k in SERVING_LABELS[:2])
    assert "readinessProbe" not in worker["spec"]["containers"][0]
    status = kube.statuses[KEY]
    by = {p["gpuProduct"]: p for p in status["pools"]}
    assert by[H100]["nodesPerReplica"] == size and "nodesPerReplica" not in by[H200]
    assert by[H100]["deployment"] == pool["metadata"]["name"]
    assert status["phase"] == "Ready" and status["ready"] == "2/2"
    fit = {f["gpuProduct"]: f for f in status["fit"]}
    assert fit[H100]["verdict"] == "MultiNode" and "not applied" not in fit[H100]["message"]
    created = [e for e in kube.events if e[1] == "PoolCreated"]
    assert created and H100 in " ".join(e[2] for e in created)
    # watched as it was written: the next pass writes nothing
    kube.calls.clear()
    await rec.reconcile(KEY)
    assert [c for c in kube.calls if c[0] != "patch_status"] == []


async def test_a_hand_edit_of_the_leaderworkerset_is_reverted() -> None:
    kube, view, rec = await rolled_out({H100: 2})
    name = kube.leaderworkersets()[H100]["metadata"]["name"]
    stored = kube.objects[("LeaderWorkerSet", "ml", name)]
    stored["spec"]["leaderWorkerTemplate"]["size"] = 3  # someone widened the group
    stored["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
        "command"] = ["sleep", "inf"]
    view.deliver(kube, ready=True)
    kube.calls.clear()
    kube.events.clear()
    await rec.reconcile(KEY)
    pool = kube.leaderworkersets()[H100]
    assert pool["spec"]["leaderWorkerTemplate"]["size"] == nodes_needed(H100)
    assert pool["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
        "command"] != ["sleep", "inf"]
    reverted = [e for e in kube.events if e[1] == "ManualChangeReverted"]
    assert len(reverted) == 1
    assert "group size" in reverted[0][2] and "worker command" in reverted[0][2]
    assert ("apply_pdb", name) not in kube.calls  # no PodDisruptionBudget for a group pool


async def test_a_rollback_restarts_the_group_with_the_lower_k() -> None:
    kube, view, rec = await rolled_out({H100: 2})
    before = kube.leaderworkersets()[H100]
    k = k_of(before)
    kube.calls.clear()
    kube.events.clear()
    actions = RollbackActions(kube, view, rec, clock=lambda: T0)
    signal = AlertSignal("MTPHitRateLow", "firing", PoolRef("ml", "ds", H100), 0.6, 0.88,
                         "alertmanager")
    outcome = await actions.apply_signals([signal])
    assert outcome.rolled_back == 1
    after = kube.leaderworkersets()[H100]
    assert k_of(after) == k - 1
    tmpl = after["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):  # both pods of the group: new K
        config = PoolConfig.from_json(argv_of(tmpl[role])[-1])
        assert (config.serve.num_speculative_tokens, config.k_mode) == (k - 1, "fixed")
        assert tmpl[role]["metadata"]["annotations"] != before["spec"]["leaderWorkerTemplate"][
            role]["metadata"]["annotations"]  # a new template: the LWS controller recreates
    assert tmpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert kube.calls == [("apply", after["metadata"]["name"]), ("patch_status", "ds")]
    assert [e[1] for e in kube.events] == ["SpeculationRolledBack"]  # no surge Event
    h100 = next(p for p in kube.statuses[KEY]["pools"] if p["gpuProduct"] == H100)
    assert (h100["numSpeculativeTokens"], h100["rollbackK"]) == (k - 1, k - 1)


async def test_a_pool_that_fits_one_node_again_becomes_a_deployment() -> None:
    kube, view, rec = await rolled_out({H100: 2})
    name = kube.leaderworkersets()[H100]["metadata"]["name"]
    body = view.resources[KEY]
    body["spec"]["fit"]["weightsGiB"] = 400.0  # 400 <= 509.8: one node
    body["metadata"]["generation"] = 2
    body["metadata"]["resourceVersion"] = "999"
    kube.events.clear()
    await rec.reconcile(KEY)
    assert kube.leaderworkersets() == {} and set(kube.deployments()) == {H100}
    assert kube.deployments()[H100]["metadata"]["name"] == name
    assert ("delete_leaderworkerset", name) in kube.calls
    removed = [e[2] for e in kube.events if e[1] == "PoolRemoved"]
    assert removed and f"LeaderWorkerSet {name} deleted" in removed[0]


async def test_a_multi_node_pool_whose_product_is_excluded_is_removed() -> None:
    kube, view, rec = await rolled_out({H100: 2, H200: 1})
    name = kube.leaderworkersets()[H100]["metadata"]["name"]
    body = view.resources[KEY]
    body["spec"]["gpuProducts"] = [H200]
    body["metadata"]["generation"] = 2
    body["metadata"]["resourceVersion"] = "999"
    await rec.reconcile(KEY)
    assert kube.leaderworkersets() == {} and set(kube.deployments()) == {H200}
    assert ("delete_leaderworkerset", name) in kube.calls
    assert ("delete_deployment", name) not in kube.calls
    assert H100 in kube.statuses[KEY].get("removedPools", [])


async def test_the_tuner_leaves_a_multi_node_pool_alone_and_says_why() -> None:
    tuning = {"speculative": {"tuning": {"mode": "Auto"}}, "replicas": 2}
    kube, _view, _rec = await rolled_out({H100: 4, H200: 2}, **tuning)
    by = {p["gpuProduct"]: p for p in kube.statuses[KEY]["pools"]}
    reason = by[H100]["tuning"]["reason"]
    assert reason.startswith("not tuned: a multi-node pool") and f"{nodes_needed(H100)} nodes" \
        in reason
    assert "not tuned" not in (by[H200].get("tuning") or {}).get("reason", "")
    # no canary for it, whatever the tuning state says
    parsed = MTPInferenceSpec.model_validate(spec(**tuning))
    plan = plan_pass(parsed, [], gpu_nodes({H100: 4, H200: 2}), MTPInferenceStatus(),
                     {"generation": 1}, {}, T0)
    h100 = next(p for p in plan.pools if p.gpu_product == H100)
    assert h100.nodes == nodes_needed(H100)
    trial = TuningTrial(k=2, from_k=h100.k, kind="canary", started="2026-12-06T12:00:00Z")
    state = {H100: PoolTuningStatus(mode="Auto", trial=trial, generation=1)}
    assert canary_plans(parsed, plan.pools, state, lambda _p: None, {}) == {}
    # the same state on a one-node pool does run a canary (the check above can fail)
    h200 = next(p for p in plan.pools if p.gpu_product == H200)
    state = {H200: PoolTuningStatus(mode="Auto", trial=trial.model_copy(
        update={"from_k": h200.k}), generation=1)}
    assert set(canary_plans(parsed, plan.pools, state, lambda _p: None, {})) == {H200}
