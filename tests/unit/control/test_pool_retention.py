"""Pools survive maintenance (control/reconciler.py over the in-memory cluster, frozen clock):
cordoned, NotReady, drained nodes or GPUs that are not allocatable keep a pool as it runs,
reported in status and by an Event; only a product no node carries any more loses its pool,
after the grace period. (The same on the real sandbox: tests/cluster/test_maintenance.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mtp_operator.control.reconciler import Reconciler
from mtp_operator.planning import GPUNode
from mtp_operator.settings import OperatorSettings
from support.fake_cluster import FakeKube, FakeView, mtpinference, node

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
KEY = ("ml", "res")
GRACE = 600


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def cluster() -> tuple[FakeKube, FakeView, Reconciler, Clock]:
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100), node("l1", L40S)])
    view.add(mtpinference("res", {"model": "org/model", "tensorParallelSize": 8}))
    clock = Clock()
    settings = OperatorSettings(poolRemovalGraceSeconds=GRACE)
    return kube, view, Reconciler(kube, view, settings, clock=clock), clock


async def _serving(kube: FakeKube, view: FakeView, rec: Reconciler) -> dict:
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    return kube.deployments()[L40S]


def _pool(kube: FakeKube, product: str) -> dict:
    return next(p for p in kube.statuses[KEY]["pools"] if p["gpuProduct"] == product)


def _condition(kube: FakeKube, ctype: str) -> dict:
    return next(c for c in kube.statuses[KEY]["conditions"] if c["type"] == ctype)


@pytest.mark.parametrize(
    "l40s",
    [
        node("l1", L40S, schedulable=False),  # cordoned, NotReady or drained
        GPUNode("l1", L40S, 0, {"nvidia.com/gpu.product": L40S}, True, capacity_gpus=8),
        GPUNode("l1", L40S, 4, {"nvidia.com/gpu.product": L40S}, True, capacity_gpus=8),
    ],
    ids=["unschedulable", "gpus-not-allocatable", "gpus-partly-taken"],
)
async def test_a_pool_without_a_schedulable_node_is_kept_and_reported(cluster, l40s) -> None:
    kube, view, rec, clock = cluster
    before = await _serving(kube, view, rec)
    view.nodes = [node("h1", H100), l40s]
    for hours in (0, 1, 24):  # however long the maintenance takes
        clock.now = T0 + timedelta(hours=hours)
        await rec.reconcile(KEY)
        view.deliver(kube, ready=True)
    assert kube.count("delete_deployment") == 0
    assert kube.deployments()[L40S]["spec"] == before["spec"]  # not even rewritten
    pool = _pool(kube, L40S)
    assert pool["retained"] == "NoSchedulableNode" and "productGoneSince" not in pool
    assert pool["readyReplicas"] == 1  # its pods keep running
    cond = _condition(kube, "PoolsRetained")
    assert cond["status"] == "True" and cond["reason"] == "NoSchedulableNode"
    assert "pods keep running" in cond["message"]
    assert kube.reasons().count("PoolRetained") == 1  # one Event, not one per pass
    status = kube.statuses[KEY]
    assert status["phase"] == "Ready" and status["poolsSummary"] == "H100:6 L40S:2"
    assert _condition(kube, "Degraded")["status"] == "False"

    view.nodes = [node("h1", H100), node("l1", L40S)]  # maintenance over
    await rec.reconcile(KEY)
    assert _condition(kube, "PoolsRetained")["status"] == "False"
    assert "retained" not in _pool(kube, L40S)


async def test_every_node_cordoned_is_no_bad_spec(cluster) -> None:
    kube, view, rec, _clock = cluster
    await _serving(kube, view, rec)
    view.nodes = [node("h1", H100, schedulable=False), node("l1", L40S, schedulable=False)]
    await rec.reconcile(KEY)
    status = kube.statuses[KEY]
    assert status["phase"] == "Ready", status  # not Degraded/NoFittingNodes: nothing to fix
    assert {p["retained"] for p in status["pools"]} == {"NoSchedulableNode"}
    assert kube.count("delete_deployment") == 0


async def test_a_gone_product_is_kept_for_the_grace_period_then_removed(cluster) -> None:
    kube, view, rec, clock = cluster
    await _serving(kube, view, rec)
    view.nodes = [node("h1", H100)]  # the L40S label removed, or the node deleted
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    pool = _pool(kube, L40S)
    assert pool["retained"] == "ProductGone" and pool["productGoneSince"] == "2026-11-29T12:00:00Z"
    assert "2026-11-29T12:10:00Z" in _condition(kube, "PoolsRetained")["message"]
    clock.now = T0 + timedelta(seconds=GRACE - 1)
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    assert L40S in kube.deployments()
    clock.now = T0 + timedelta(seconds=GRACE)
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    assert set(kube.deployments()) == {H100}
    assert kube.statuses[KEY]["removedPools"] == [L40S]
    assert _condition(kube, "PoolsRetained")["status"] == "False"
    removed = [m for _, r, m, _ in kube.events if r == "PoolRemoved"]
    assert removed == [f"removed pool {L40S}: no node has carried this GPU product for 600s"]


async def test_a_product_that_returns_within_the_grace_period_keeps_its_pool(cluster) -> None:
    kube, view, rec, clock = cluster
    await _serving(kube, view, rec)
    view.nodes = [node("h1", H100)]
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    clock.now = T0 + timedelta(seconds=GRACE - 10)
    view.nodes = [node("h1", H100), node("l1-new", L40S)]  # the node was replaced
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    clock.now = T0 + timedelta(seconds=GRACE * 3)
    await rec.reconcile(KEY)
    assert set(kube.deployments()) == {H100, L40S} and kube.count("delete_deployment") == 0
    assert "productGoneSince" not in _pool(kube, L40S)


async def test_gpu_products_edit_removes_a_pool_at_once(cluster) -> None:
    kube, view, rec, _clock = cluster
    await _serving(kube, view, rec)
    view.resources[KEY]["spec"]["gpuProducts"] = [H100]
    view.resources[KEY]["metadata"]["generation"] = 2
    await rec.reconcile(KEY)
    assert set(kube.deployments()) == {H100}
    assert [m for _, r, m, _ in kube.events if r == "PoolRemoved"] == [
        f"removed pool {L40S}: gpuProducts no longer lists it"
    ]
