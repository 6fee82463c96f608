"""What keeps a rollout of thousands of pools close to the API server's floor: status writes
(what only reports progress waits for the next write, at most PROGRESS_WRITES_PER_SECOND
of them across the resources rolling out; phase and Ready are written at once), one Service
apply, no pass for a pool event the last pass saw, and indexed bodies without managedFields."""

from __future__ import annotations

import asyncio
import functools
from datetime import UTC, datetime

import pytest

from mtp_operator.api.v1alpha1 import MTPInferenceSpec, MTPInferenceStatus
from mtp_operator.control import reconciler as reconciler_module
from mtp_operator.control import writes
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.reconcile_plan import Applied, pass_status, plan_pass, significant
from mtp_operator.settings import OperatorSettings
from mtp_operator.status import ObservedPool
from support.fake_cluster import FakeKube, FakeView, mtpinference, node

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
H100, L40S = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"
SPEC = {"model": "org/model", "tensorParallelSize": 8}
KEY = ("ml", "res")


def status_for(observed: dict[str, ObservedPool], previous=None) -> MTPInferenceStatus:
    spec = MTPInferenceSpec.model_validate(SPEC)
    nodes = [node("h1", H100), node("l1", L40S)]
    previous = previous or MTPInferenceStatus()
    plan = plan_pass(spec, [], nodes, previous, {"generation": 1}, {}, T0)
    applied = Applied({H100: "h1", L40S: "h2"})
    return pass_status("res", 1, plan, previous, observed, applied, T0)


def condition(status: MTPInferenceStatus, kind: str) -> str:
    return next(c.status for c in status.conditions if c.type == kind)


def test_rolled_out_but_not_ready_is_progress_only() -> None:
    created = status_for({})
    rolled = status_for({p: ObservedPool(desired=1, ready=0, up_to_date=True)
                         for p in (H100, L40S)}, created)  # fmt: skip
    assert (created.phase, rolled.phase) == ("Progressing", "Progressing")
    assert (condition(created, "Progressing"), condition(rolled, "Progressing")) == (
        "True", "False")  # fmt: skip
    assert significant(created) == significant(rolled)


def test_ready_and_a_new_rollout_are_significant() -> None:
    rolled = status_for({p: ObservedPool(desired=1, ready=0, up_to_date=True)
                         for p in (H100, L40S)})  # fmt: skip
    ready = status_for({p: ObservedPool(desired=1, ready=1, up_to_date=True)
                        for p in (H100, L40S)}, rolled)  # fmt: skip
    assert ready.phase == "Ready" and significant(ready) != significant(rolled)
    pools = {H100: ObservedPool(desired=1, ready=1, up_to_date=False),
             L40S: ObservedPool(desired=1, ready=1, up_to_date=True)}  # fmt: skip
    again = status_for(pools, ready)
    assert again.phase == "Progressing" and significant(again) != significant(ready)


def _two_pools(monkeypatch, counts_interval: float):
    """A resource with an H100 and an L40S pool on the in-memory cluster, progress-only
    status writes at most every `counts_interval` seconds."""
    monkeypatch.setattr(reconciler_module, "STATUS_COUNTS_INTERVAL", counts_interval)
    # one resource rolling out: its interval is counts_interval, not the fleet's share
    monkeypatch.setattr(reconciler_module, "PROGRESS_WRITES_PER_SECOND", 1 / counts_interval)
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100), node("l1", L40S)])
    view.add(mtpinference("res", SPEC))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    return kube, view, rec


async def test_a_rollout_takes_two_status_writes_when_it_is_quick(monkeypatch) -> None:
    kube, view, rec = _two_pools(monkeypatch, counts_interval=60.0)
    await rec.reconcile(KEY)
    assert kube.count("patch_status") == 1  # Progressing, pools created
    view.deliver(kube, ready=False)  # the Deployment controller: rolled out, pods not ready
    await rec.reconcile(KEY)
    assert kube.count("patch_status") == 1  # progress only: deferred
    assert rec.slot(KEY).turn.later is not None  # ... to a pass of its own, not dropped
    view.deliver(kube, ready=True)
    await rec.reconcile(KEY)
    assert kube.count("patch_status") == 2 and kube.statuses[KEY]["phase"] == "Ready"
    assert {c["type"]: c["status"] for c in kube.statuses[KEY]["conditions"]}["Progressing"] == (
        "False")  # fmt: skip
    rec.forget(KEY)


async def test_deferred_progress_is_written_by_the_later_pass(monkeypatch) -> None:
    kube, view, rec = _two_pools(monkeypatch, counts_interval=0.2)
    await rec.reconcile(KEY)
    view.deliver(kube, ready=False)
    await rec.reconcile(KEY)
    assert kube.count("patch_status") == 1
    await asyncio.sleep(0.5)  # the pass reconcile_later() scheduled
    assert kube.count("patch_status") == 2
    conditions = {c["type"]: c["status"] for c in kube.statuses[KEY]["conditions"]}
    assert (kube.statuses[KEY]["phase"], conditions["Progressing"]) == ("Progressing", "False")


async def test_the_first_status_counts_the_pools_just_created() -> None:
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100), node("l1", L40S)])
    view.add(mtpinference("res", SPEC))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    await rec.reconcile(KEY)
    status = kube.statuses[KEY]
    assert [(p["replicas"], p["readyReplicas"]) for p in status["pools"]] == [(1, 0), (1, 0)]
    assert status["ready"] == "0/2"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Progressing"] == "True"


async def test_the_progress_interval_grows_with_the_resources_rolling_out() -> None:
    kube, view = FakeKube(), FakeView(nodes=[node(f"h{i}", H100) for i in range(30)])
    keys = [view.add(mtpinference(f"r{i}", SPEC)) for i in range(250)]
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    assert rec.progress_interval() == reconciler_module.STATUS_COUNTS_INTERVAL
    await rec.reconcile_all()
    assert {s["phase"] for s in kube.statuses.values()} == {"Progressing"}
    # 250 resources rolling out share PROGRESS_WRITES_PER_SECOND progress writes a second
    assert rec.progress_interval() == 250 / reconciler_module.PROGRESS_WRITES_PER_SECOND
    view.deliver(kube, ready=True)
    await rec.reconcile_all()
    assert {s["phase"] for s in kube.statuses.values()} == {"Ready"}
    assert rec.progress_interval() == reconciler_module.STATUS_COUNTS_INTERVAL
    for key in keys:
        rec.forget(key)


async def test_the_service_is_applied_once_until_the_watch_shows_it_gone(monkeypatch) -> None:
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100)])
    view.add(mtpinference("res", SPEC))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)

    def service_applies() -> int:
        return sum(1 for m, name in kube.calls if m == "apply" and name.endswith("-openai"))

    await rec.reconcile(KEY)
    for _ in range(3):  # passes before the watch shows the Service: no second apply
        await rec.reconcile(KEY)
    assert service_applies() == 1
    view.deliver(kube, ready=True)
    await rec.reconcile(KEY)
    assert service_applies() == 1
    view.services.discard(KEY)  # someone deleted it, and the watch shows that
    await rec.reconcile(KEY)
    assert service_applies() == 2
    monkeypatch.setattr(writes, "SERVICE_WATCH_GRACE", 0.0)
    await rec.reconcile(KEY)  # the watch never showed the new one: applied again after grace
    assert service_applies() == 3
    rec.forget(KEY)


async def test_a_pool_event_the_last_pass_saw_is_no_news() -> None:
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100), node("l1", L40S)])
    view.add(mtpinference("res", SPEC))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    assert rec.pool_news(KEY, {"metadata": {"resourceVersion": "1"}})  # nothing seen yet
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    pools = view.pool_deployments(KEY)
    assert all(rec.pool_news(KEY, d) for d in pools.values())  # the first pass saw none
    await rec.reconcile(KEY)
    assert not any(rec.pool_news(KEY, d) for d in pools.values())  # ... this one all
    seen = pools[H100]
    versions = iter(range(999, 2000))  # each event a later version, as a watch brings them

    def newer(**changes: object) -> dict:
        version = str(next(versions))
        body = {**seen, "metadata": {**seen["metadata"], "resourceVersion": version}}
        for part, value in changes.items():
            if part in ("labels", "annotations"):
                body["metadata"] = {**body["metadata"], part: value}
            else:
                body[part] = value
        return body

    # a newer version whose counts, spec and metadata are as seen: a condition's reason,
    # availableReplicas
    quiet = {**seen["status"], "availableReplicas": 1,
             "conditions": [{"type": "Available", "status": "True"}]}
    assert not rec.pool_news(KEY, newer(status=quiet))
    assert rec.pool_news(KEY, newer(status={**seen["status"], "readyReplicas": 0}))
    assert rec.pool_news(KEY, newer(status={**seen["status"], "observedGeneration": 0}))
    assert rec.pool_news(KEY, newer(spec={**seen["spec"], "replicas": 3}))
    assert rec.pool_news(KEY, newer(labels={**seen["metadata"]["labels"], "x": "y"}))
    assert rec.pool_news(KEY, newer(annotations={}))
    rec.forget(KEY)


def test_indexed_bodies_leave_the_managed_fields_out() -> None:
    from mtp_operator.adapters.kube import slim

    body = {"metadata": {"name": "p", "resourceVersion": "7", "managedFields": [{"f": 1}]},
            "spec": {"replicas": 1}, "status": {"readyReplicas": 1}}  # fmt: skip
    out = slim(body)
    assert out["metadata"] == {"name": "p", "resourceVersion": "7"}
    assert out["spec"] is body["spec"] and out["status"] is body["status"]
    assert "managedFields" in body["metadata"]  # the watch event's own copy is untouched
    assert slim({"metadata": {"name": "q"}}) == {"metadata": {"name": "q"}}


async def _node_event(rec: Reconciler) -> None:
    """What handlers.node_changed does."""
    if rec.gpu_inventory_changed():
        await rec.reconcile_for_nodes()


async def _listed_event(rec: Reconciler, view: FakeView, key) -> None:
    """What handlers.resource_changed does with a resource's (listed) event."""
    if rec.resource_news(key, view.resource(key)):
        await rec.reconcile_or_retry(key)


def _count_passes(rec: Reconciler, monkeypatch) -> list:
    passes: list = []
    real = rec._pass

    async def counted(key, *a, **kw):
        passes.append(key)
        return await real(key, *a, **kw)

    monkeypatch.setattr(rec, "_pass", counted)
    return passes


async def test_a_node_event_amid_the_listed_events_adds_no_pass(monkeypatch) -> None:
    """At start-up kopf runs the handlers of different objects concurrently: the first node
    event and the resources' listed events at once still make one pass a resource."""
    kube, view = FakeKube(), FakeView(nodes=[node(f"h{i}", H100) for i in range(4)])
    keys = [view.add(mtpinference(f"r{i}", SPEC)) for i in range(20)]
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    passes = _count_passes(rec, monkeypatch)

    await asyncio.gather(_node_event(rec), *(_listed_event(rec, view, k) for k in keys))
    await asyncio.sleep(0)
    assert sorted(passes) == sorted(keys)
    for key in keys:
        rec.forget(key)


@pytest.mark.parametrize("nodes_first", [True, False], ids=["node-event-first", "listed-first"])
async def test_a_start_makes_one_pass_a_resource(monkeypatch, nodes_first) -> None:
    """At start-up kopf hands over every resource's listed event and the nodes' events, in
    either order, while nodes send heartbeats; a pass a resource is what the inputs need
    (each pass reads the same resource version and equal nodes)."""
    kube, view = FakeKube(), FakeView(nodes=[node(f"h{i}", H100) for i in range(4)])
    keys = [view.add(mtpinference(f"r{i}", SPEC)) for i in range(20)]
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    passes = _count_passes(rec, monkeypatch)

    async def listed_events() -> None:
        for key in keys:
            await _listed_event(rec, view, key)

    nodes = functools.partial(_node_event, rec)
    first, then = (nodes, listed_events) if nodes_first else (listed_events, nodes)
    await first()
    view.nodes[0] = node("h0", H100)  # a node's heartbeat between: an equal new object
    await then()
    assert sorted(passes) == sorted(keys)
    for key in keys:
        rec.forget(key)


async def test_a_new_resource_version_or_new_nodes_are_news(monkeypatch) -> None:
    kube, view = FakeKube(), FakeView(nodes=[node("h0", H100), node("h1", H100)])
    keys = [view.add(mtpinference(f"r{i}", SPEC)) for i in range(3)]
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    assert rec.resource_news(keys[0], view.resource(keys[0]))  # never passed
    await rec.reconcile_all()
    passes = _count_passes(rec, monkeypatch)
    body = view.resource(keys[0])
    assert not rec.resource_news(keys[0], body)
    body["metadata"]["resourceVersion"] = str(int(body["metadata"].get("resourceVersion") or 0) + 1)
    assert rec.resource_news(keys[0], body)
    await rec.reconcile_for_nodes()  # the nodes every pass read: nothing to do
    assert passes == []
    view.nodes[0] = node("h0", H100)  # a heartbeat: a new object, equal to the old one
    await rec.reconcile_for_nodes()
    assert passes == []
    view.nodes[1] = node("h1", H100, gpus=4)  # a node event replaces its node's object
    await rec.reconcile_for_nodes()
    assert sorted(passes) == sorted(keys)
    passes.clear()
    view.nodes = [view.nodes[1], view.nodes[0]]  # same nodes, another order: read again
    await rec.reconcile_for_nodes()
    assert sorted(passes) == sorted(keys)
    for key in keys:
        rec.forget(key)
