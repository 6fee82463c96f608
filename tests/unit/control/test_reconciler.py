"""control/reconciler.py over an in-memory cluster (tests/support/fake_cluster.py) and a
frozen clock: the steps of a pass (plan, desired objects, apply, status) and what a pass
writes, or does not write, as the watch catches up."""

from __future__ import annotations

import asyncio
import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from mtp_operator import builders
from mtp_operator.api.v1alpha1 import MTPInferenceSpec, MTPInferenceStatus
from mtp_operator.control import pool_writes
from mtp_operator.control.reconciler import Reconciler, TransientReconcileError
from mtp_operator.naming import (
    ANNOTATION_COMMAND,
    ANNOTATION_GPU_PRODUCT,
    ANNOTATION_SETTINGS_HASH,
)
from mtp_operator.reconcile_plan import Applied, pass_status, plan_pass
from mtp_operator.settings import OperatorSettings
from mtp_operator.status import ObservedPool
from support.fake_cluster import FakeKube, FakeView, api_error, mtpinference, node

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
SPEC = {"model": "org/model", "tensorParallelSize": 8}
KEY = ("ml", "res")


def k_of(deployment: dict[str, Any]) -> int:
    """The K a pool Deployment's vllm command line asks for (0: no speculation)."""
    argv = json.loads(deployment["metadata"]["annotations"][ANNOTATION_COMMAND])
    if "--speculative-config" not in argv:
        return 0
    return json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]


@pytest.fixture
def cluster() -> tuple[FakeKube, FakeView, Reconciler]:
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100), node("l1", L40S)])
    view.add(mtpinference("res", SPEC))
    return kube, view, Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)


# ---- the pure steps -------------------------------------------------------------------------


def test_plan_step_gives_each_fitting_product_its_k() -> None:
    spec = MTPInferenceSpec.model_validate(SPEC)
    nodes = [node("h1", H100), node("l1", L40S), node("small", "NVIDIA-A100-SXM4-80GB", gpus=4)]
    plan = plan_pass(spec, [], nodes, MTPInferenceStatus(), {"generation": 1}, {}, T0)
    assert plan.problems == []
    assert [(p.gpu_product, p.k, p.source) for p in plan.pools] == [
        (H100, 6, "profile"),
        (L40S, 2, "profile"),
    ]  # the A100 node has 4 GPUs, a replica needs 8
    overridden = plan_pass(spec, [], nodes, MTPInferenceStatus(), {}, {"L40S": 1}, T0)
    assert [p.k for p in overridden.pools] == [6, 1]


def test_plan_step_without_fitting_nodes_reports_the_field() -> None:
    spec = MTPInferenceSpec.model_validate({**SPEC, "gpuProducts": ["NVIDIA-B200"]})
    plan = plan_pass(spec, [], [node("h1", H100)], MTPInferenceStatus(), {}, {}, T0)
    assert plan.pools == [] and plan.problem_reason == "NoFittingNodes"
    assert [p.field for p in plan.problems] == ["gpuProducts"]


def test_status_step_from_plan_and_observations() -> None:
    spec = MTPInferenceSpec.model_validate(SPEC)
    plan = plan_pass(spec, [], [node("h1", H100)], MTPInferenceStatus(), {"generation": 3}, {}, T0)
    observed = {H100: ObservedPool(desired=1, ready=1, up_to_date=True)}
    status = pass_status("res", 3, plan, MTPInferenceStatus(), observed, Applied({H100: "h"}), T0)
    assert (status.phase, status.ready, status.pools_summary) == ("Ready", "1/1", "H100:6")
    assert status.pools[0].settings_hash == "h" and status.observed_generation == 3
    failed = pass_status("res", 3, plan, MTPInferenceStatus(), {}, Applied({}, [], "500: x"), T0)
    assert failed.phase == "Degraded"
    degraded = next(c for c in failed.conditions if c.type == "Degraded")
    assert (degraded.reason, degraded.message) == ("ApplyFailed", "500: x")


# ---- whole passes ---------------------------------------------------------------------------


async def test_first_pass_creates_the_pools_then_a_quiet_pass_writes_nothing(cluster) -> None:
    kube, view, rec = cluster
    await rec.reconcile(KEY)
    pools = kube.deployments()
    assert {p: k_of(d) for p, d in pools.items()} == {H100: 6, L40S: 2}
    assert kube.count("apply") == 3  # the Service and two pools
    assert kube.reasons() == ["PoolCreated"]  # one Event naming both pools
    message = kube.events[0][2]
    for product, deployment in pools.items():
        name = deployment["metadata"]["name"]
        assert f"pool {product}: deployment {name}, K={k_of(deployment)} " in message
    status = kube.statuses[KEY]
    assert status["phase"] == "Progressing" and status["poolsSummary"] == "H100:6 L40S:2"
    assert kube.count("patch_status") == 1

    view.deliver(kube, ready=True)  # the watch shows the pools (rolled out) and the status
    await rec.reconcile(KEY)
    assert kube.statuses[KEY]["phase"] == "Ready"
    assert kube.count("apply") == 3 and kube.count("patch_status") == 2

    view.deliver(kube, ready=True)
    calls = len(kube.calls)
    await rec.reconcile(KEY)
    assert len(kube.calls) == calls, "a pass with nothing to do makes no API request"


async def test_our_own_status_write_coming_back_is_no_news(cluster) -> None:
    kube, view, rec = cluster
    await rec.reconcile(KEY)  # its last write is the status patch
    view.deliver(kube)
    body = view.resources[KEY]
    assert body["metadata"]["resourceVersion"] == str(kube.rv)  # what the patch returned
    assert rec.own_status_echo(KEY, body)
    body["metadata"]["resourceVersion"] = str(kube.rv + 1)  # anyone's change after it
    assert not rec.own_status_echo(KEY, body)
    assert not rec.own_status_echo(("default", "never-reconciled"), body)


async def test_a_pool_status_change_does_not_diff_the_pool_again(cluster, monkeypatch) -> None:
    kube, view, rec = cluster
    await rec.reconcile(KEY)
    view.deliver(kube)
    diffs = []
    real = pool_writes.drifted_fields
    monkeypatch.setattr(pool_writes, "drifted_fields",
                        lambda want, have: diffs.append(1) or real(want, have))
    await rec.reconcile(KEY)
    assert len(diffs) == 2  # both pools, as the watch shows them
    view.deliver(kube, ready=True)  # new copies; only the Deployments' status changed
    await rec.reconcile(KEY)
    assert len(diffs) == 2 and kube.statuses[KEY]["phase"] == "Ready"
    # the memo now holds the copies the watch brought, not the older equal ones (memory)
    for product, (_, spec, _, _) in rec.slot(KEY).memos.drift.items():
        assert spec is view.deployments[KEY][product]["spec"]
    # a hand edit, arriving as the watch brings it: a new body (watched bodies are never
    # changed in place; the memo holds the one it last compared)
    edited = copy.deepcopy(view.deployments[KEY][H100])
    edited["spec"]["replicas"] = 5
    view.deployments[KEY][H100] = edited
    await rec.reconcile(KEY)
    assert len(diffs) == 3 and kube.reasons()[-1] == "ManualChangeReverted"
    assert kube.deployments()[H100]["spec"]["replicas"] == 1


async def test_annotations_the_operator_does_not_read_bring_no_pass_and_no_diff(
    cluster, monkeypatch
) -> None:
    """The Deployment controller annotates every Deployment with its revision right after it
    is created, and other tools add their own annotations: neither is read by a pass, so
    such an event is no news, and a pass finds the drift result it had (no pool rendered
    and compared again). One of the operator's own annotations changed is news."""
    kube, view, rec = cluster
    await rec.reconcile(KEY)
    view.deliver(kube)
    diffs, renders = [], []
    real_diff, real_render = pool_writes.drifted_fields, builders.desired_objects
    monkeypatch.setattr(pool_writes, "drifted_fields",
                        lambda want, have: diffs.append(1) or real_diff(want, have))
    monkeypatch.setattr(builders, "desired_objects",
                        lambda *a, **kw: renders.append(1) or real_render(*a, **kw))
    await rec.reconcile(KEY)
    assert len(diffs) == 2 and len(renders) == 1  # the watched pools, new to the memo
    for product, old in list(view.deployments[KEY].items()):
        new = copy.deepcopy(old)
        new["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
        new["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "1"
        new["metadata"]["annotations"]["argocd.argoproj.io/tracking-id"] = "app:apps/x"
        view.deployments[KEY][product] = new
        rec.pool_seen(KEY, new)
        assert not rec.pool_news(KEY, new)
    await rec.reconcile(KEY)  # a resync's pass
    assert len(diffs) == 2 and len(renders) == 1 and kube.count("apply") == 3
    edited = copy.deepcopy(view.deployments[KEY][H100])
    edited["metadata"]["resourceVersion"] = str(int(edited["metadata"]["resourceVersion"]) + 1)
    edited["metadata"]["annotations"][ANNOTATION_COMMAND] = "edited-by-hand"
    view.deployments[KEY][H100] = edited
    rec.pool_seen(KEY, edited)
    assert rec.pool_news(KEY, edited)
    await rec.reconcile(KEY)
    assert len(diffs) == 3 and kube.reasons()[-1] == "ManualChangeReverted"
    assert kube.deployments()[H100]["metadata"]["annotations"][ANNOTATION_COMMAND] \
        != "edited-by-hand"


async def test_rendered_objects_are_not_held_between_passes(cluster, monkeypatch) -> None:
    """The desired objects (~9 KB a pool) are rendered when a pass compares a changed pool or
    writes one, and let go when it ends; a pass for a pool's status change renders nothing."""
    kube, view, rec = cluster
    renders = []
    real = builders.desired_objects
    monkeypatch.setattr(builders, "desired_objects",
                        lambda *a, **kw: renders.append(1) or real(*a, **kw))
    await rec.reconcile(KEY)  # creates both pools
    assert len(renders) == 1 and kube.count("apply") == 3
    desired = rec.slot(KEY).memos.desired
    assert desired is not None and desired._objects is None
    view.deliver(kube)
    await rec.reconcile(KEY)  # the watched pools, new to the drift memo: compared
    assert len(renders) == 2 and desired._objects is None
    view.deliver(kube, ready=True)  # only the Deployments' status changed
    await rec.reconcile(KEY)
    assert len(renders) == 2 and kube.statuses[KEY]["phase"] == "Ready"
    assert rec.slot(KEY).memos.desired is desired and desired._objects is None
    assert kube.count("apply") == 3
    # a hand edit is compared against objects rendered again, and reverted
    edited = copy.deepcopy(view.deployments[KEY][H100])
    edited["spec"]["replicas"] = 5
    view.deployments[KEY][H100] = edited
    await rec.reconcile(KEY)
    assert len(renders) == 3 and kube.deployments()[H100]["spec"]["replicas"] == 1


async def test_a_pool_event_with_nothing_new_moves_what_was_read_to_the_new_copy(cluster) -> None:
    """A Deployment event that changes nothing a pass reads (here a condition the controller
    adds) brings no pass; what the last pass read and compared for drift is taken from the
    new copy from then on, so the older equal copy is not held beside the one the index
    keeps (a second copy of every settled pool's spec)."""
    kube, view, rec = cluster
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    await rec.reconcile(KEY)
    slot = rec.slot(KEY)
    old = view.deployments[KEY][H100]
    assert slot.seen.pools[H100][1][1] is old["spec"]
    assert slot.memos.drift[H100][1] is old["spec"]
    new = copy.deepcopy(old)
    new["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
    new["status"]["conditions"] = [{"type": "Available", "status": "True",
                                    "reason": "MinimumReplicasAvailable"}]
    view.deployments[KEY][H100] = new
    rec.pool_seen(KEY, new)
    assert not rec.pool_news(KEY, new)
    assert slot.seen.pools[H100][1][1] is new["spec"]
    assert slot.seen.pools[H100][0] == int(new["metadata"]["resourceVersion"])
    memo = slot.memos.drift[H100]
    ours = new["metadata"]["annotations"]
    assert memo[1] is new["spec"]
    assert memo[2] == (ours[ANNOTATION_SETTINGS_HASH], ours[ANNOTATION_COMMAND])
    assert all(a is b for a, b in zip(memo[2], (ours[ANNOTATION_SETTINGS_HASH],
                                                ours[ANNOTATION_COMMAND]), strict=True))
    assert memo[3] == []  # the drift result of the same comparison, kept
    # a real change is still news, and is not taken over without a pass
    edited = copy.deepcopy(new)
    edited["metadata"]["resourceVersion"] = str(int(new["metadata"]["resourceVersion"]) + 1)
    edited["spec"]["replicas"] = 3
    assert rec.pool_news(KEY, edited)
    assert slot.seen.pools[H100][1][1] is new["spec"]


async def test_a_pass_with_nothing_to_write_runs_through_without_yielding(cluster) -> None:
    """Which pools drifted is decided before any write is awaited: a pass with nothing to
    write finishes in one step, so passes at a restart (1,000 at once) run one after the
    other, each letting go of its rendered objects, instead of all being under way at once."""
    kube, view, rec = cluster
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    await rec.reconcile(KEY)
    calls = len(kube.calls)
    step = rec.reconcile(KEY).__await__()
    with pytest.raises(StopIteration):
        step.send(None)  # done at the first step: it never waited
    assert len(kube.calls) == calls  # and wrote nothing
    # a pass with a write to make does wait for it (the write is a real await)
    edited = copy.deepcopy(view.deployments[KEY][H100])
    edited["spec"]["replicas"] = 5
    view.deployments[KEY][H100] = edited
    await rec.reconcile(KEY)
    assert kube.deployments()[H100]["spec"]["replicas"] == 1


async def test_a_pass_before_the_watch_does_not_create_twice(cluster) -> None:
    kube, _view, rec = cluster
    await rec.reconcile(KEY)
    await rec.reconcile(KEY)  # no watch event delivered yet
    assert kube.count("apply") == 3 and kube.reasons().count("PoolCreated") == 1
    assert kube.events[0][2].count("pool ") == 2


async def test_once_the_watch_shows_a_pool_no_copy_a_write_returned_is_kept(cluster) -> None:
    """A pass before the watch compares against the Deployments the writes returned; once
    the watch shows them (same version, so no news and no pass), neither our copy nor the
    drift memo that compared against it is kept (memory: a second copy of every pool)."""
    kube, view, rec = cluster
    await rec.reconcile(KEY)
    await rec.reconcile(KEY)  # no watch event yet: the memo compared our copies
    slot = rec.slot(KEY)
    ours = {p: body["spec"] for p, body in slot.ours.pools.items()}
    assert set(ours) == {H100, L40S}
    assert all(slot.memos.drift[p][1] is ours[p] for p in ours)
    view.deliver(kube)
    for product in (H100, L40S):
        watched = view.deployments[KEY][product]
        assert not rec.pool_news(KEY, watched)  # the version the last pass saw
        rec.pool_seen(KEY, watched)
    assert slot.ours.pools == {}
    assert all(memo[1] is not ours.get(p) for p, memo in slot.memos.drift.items())
    await rec.reconcile(KEY)  # the next pass compares the watched copies: nothing to write
    assert kube.count("apply") == 3
    assert {p: m[1] is view.deployments[KEY][p]["spec"] for p, m in slot.memos.drift.items()} \
        == {H100: True, L40S: True}


async def test_a_spec_change_rolls_the_pools(cluster) -> None:
    kube, view, rec = cluster
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    body = view.resources[KEY]
    body["spec"] = {**SPEC, "speculative": {"numSpeculativeTokens": 3}}
    body["metadata"]["generation"] = 2
    await rec.reconcile(KEY)
    assert {p: k_of(d) for p, d in kube.deployments().items()} == {H100: 3, L40S: 3}
    # one Event a reason, a pass; PoolRollout says how the pods are replaced (issue 37)
    assert kube.reasons() == ["PoolCreated", "PoolUpdated", "PoolRollout"]
    assert kube.events[-2][2] == f"pool {H100}: K=3 (override: numSpeculativeTokens set in " \
        f"the spec); pool {L40S}: K=3 (override: numSpeculativeTokens set in the spec)"
    # one 8-GPU node a product, one 8-GPU replica a pool: no GPU left for a new pod first
    rollout_message = kube.events[-1][2]
    for product in (H100, L40S):
        assert f"pool {product}: no spare slot on {product} (0 of 8 GPUs" in rollout_message
    assert rollout_message.count("the pool is down until the new pod is Ready") == 2
    for deploy in kube.deployments().values():
        assert deploy["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0,
                                                               "maxUnavailable": 1}
    assert kube.statuses[KEY]["observedGeneration"] == 2


async def test_an_edited_pool_is_restored(cluster) -> None:
    kube, view, rec = cluster
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    edited = view.deployments[KEY][L40S]
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:1"
    await rec.reconcile(KEY)
    assert kube.reasons()[-1] == "ManualChangeReverted"
    restored = kube.deployments()[L40S]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert restored == OperatorSettings().default_image


async def test_a_gone_gpu_product_loses_its_pool(cluster) -> None:
    kube, view, rec = cluster
    rec.settings = OperatorSettings(poolRemovalGraceSeconds=0)  # retention: test_maintenance
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    view.nodes = [node("h1", H100)]
    await rec.reconcile(KEY)
    assert set(kube.deployments()) == {H100}
    assert kube.reasons()[-1] == "PoolRemoved"
    assert kube.statuses[KEY]["removedPools"] == [L40S]


async def test_an_invalid_spec_is_reported_and_touches_no_pool(cluster) -> None:
    kube, view, rec = cluster
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    applies = kube.count("apply")
    view.resources[KEY]["spec"] = {**SPEC, "speculative": {"method": "eagle"}}
    view.resources[KEY]["metadata"]["generation"] = 2
    await rec.reconcile(KEY)
    assert kube.count("apply") == applies and set(kube.deployments()) == {H100, L40S}
    status = kube.statuses[KEY]
    assert status["phase"] == "Invalid" and status["poolsSummary"] == "H100:6 L40S:2"
    assert kube.events[-1][1:] == (
        "InvalidSpec",
        "speculative.method: 'eagle' is not an MTP method vLLM 0.33.0 accepts",
        "Warning",
    )


async def test_an_api_error_is_in_status_and_retried(cluster) -> None:
    kube, _view, rec = cluster
    kube.fail["apply"] = api_error(500, "etcd is away")
    with pytest.raises(TransientReconcileError):
        await rec.reconcile(KEY)
    status = kube.statuses[KEY]
    assert status["phase"] == "Degraded"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["reason"], degraded["message"]) == ("ApplyFailed", "500: etcd is away")
    await rec.reconcile(KEY)  # the retry
    assert set(kube.deployments()) == {H100, L40S}


def test_desired_objects_are_the_builders_own(cluster) -> None:
    _kube, _view, rec = cluster
    spec = MTPInferenceSpec.model_validate(SPEC)
    plan = plan_pass(spec, [], [node("h1", H100)], MTPInferenceStatus(), {}, {}, T0)
    memos = rec.slot(KEY).memos
    memos.parsed_spec({"spec": SPEC})
    desired = memos.desired_set(KEY, "uid-res", spec, plan.pools, rec.settings)
    want = builders.desired_objects(
        "res", "ml", "uid-res", spec, plan.pools, OperatorSettings().default_image, {}
    )
    assert desired.objects() == want
    assert desired.hashes == tuple(
        d["metadata"]["annotations"][ANNOTATION_SETTINGS_HASH] for d in want[1:]
    )
    assert memos.desired_set(KEY, "uid-res", spec, plan.pools, rec.settings) is desired  # reused
    desired.release()  # let go after a pass; rendered again, equal, when a pass needs them
    assert desired.objects() == want


class _GatedKube(FakeKube):
    """FakeKube whose Deployment writes wait until `gate` is set, noting how many were in
    flight at once and where each Event fell among the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.written = 0
        self.written_at_events: list[int] = []

    async def event(self, involved, reason, message, type_="Normal"):
        self.written_at_events.append(self.written)
        await super().event(involved, reason, message, type_)

    async def apply(self, obj):
        if obj["kind"] != "Deployment":
            return await super().apply(obj)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            out = await super().apply(obj)
            self.written += 1
            return out
        finally:
            self.in_flight -= 1


async def test_the_pools_of_a_pass_are_written_at_once_and_their_events_follow() -> None:
    kube = _GatedKube()
    view = FakeView(nodes=[node("h1", H100), node("l1", L40S)])
    view.add(mtpinference("res", SPEC))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    task = asyncio.create_task(rec.reconcile(KEY))
    for _ in range(50):  # until both pools' writes wait at the gate
        await asyncio.sleep(0)
        if kube.in_flight == 2:
            break
    assert kube.in_flight == 2, "the second pool's write waited for the first's"
    assert kube.events == [], "no Event before the writes are done"
    kube.gate.set()
    await task
    assert kube.most_in_flight == 2
    assert kube.written_at_events == [2], "the Event after both pools were written"
    assert kube.reasons() == ["PoolCreated"]


async def test_one_failed_pool_write_does_not_stop_the_others(cluster) -> None:
    kube, _view, rec = cluster
    real_apply = kube.apply

    async def apply(obj):
        if obj["kind"] == "Deployment" and (
                obj["metadata"]["annotations"][ANNOTATION_GPU_PRODUCT] == L40S):
            raise api_error(500, "etcd is away")
        return await real_apply(obj)

    kube.apply = apply
    with pytest.raises(TransientReconcileError):
        await rec.reconcile(KEY)
    assert set(kube.deployments()) == {H100}
    assert kube.reasons() == ["PoolCreated"]  # the pool that was written, only
    assert H100 in kube.events[0][2] and L40S not in kube.events[0][2]
    degraded = next(c for c in kube.statuses[KEY]["conditions"] if c["type"] == "Degraded")
    assert degraded["message"] == "500: etcd is away"


def test_current_status_reads_a_watched_status_once_per_object(cluster, monkeypatch) -> None:
    # the evaluator and the tuner ask for every resource's status each round; the watched
    # body's status is validated once per object the watch delivered, not once per ask
    import mtp_operator.control.reconciler as rec

    _, _, reconciler = cluster
    calls: list[Any] = []
    real = rec.read_status
    monkeypatch.setattr(rec, "read_status", lambda raw: calls.append(raw) or real(raw))
    status = {"phase": "Ready", "ready": "1/1", "poolsSummary": "H100:6"}
    body = {"metadata": {"resourceVersion": "7"}, "status": status}
    first = reconciler.current_status(KEY, body)
    again = reconciler.current_status(KEY, {**body})  # a new body, the same status object
    assert first is again and len(calls) == 1
    assert (first.phase, first.ready, first.pools_summary) == ("Ready", "1/1", "H100:6")
    # the watch brings a new status object (even with the same content): read afresh
    changed = {"metadata": {"resourceVersion": "8"},
               "status": {**status, "phase": "Progressing"}}
    assert reconciler.current_status(KEY, changed).phase == "Progressing" and len(calls) == 2
    reconciler.forget(KEY)
    assert reconciler.current_status(KEY, changed).phase == "Progressing" and len(calls) == 3


async def test_a_rollout_surges_where_the_product_has_a_spare_slot() -> None:
    """Issue 37: the H100 node has 16 GPUs and the pool takes 8 (one replica): its new pod
    starts before the old one leaves; the L40S node has 8 (none spare): one at a time, and the
    Event says so. Each pool gets a PodDisruptionBudget, written once while its minAvailable
    stays (0 for one replica, 1 from two)."""
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100, gpus=16), node("l1", L40S)])
    view.add(mtpinference("res", SPEC))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    budgets = {n: o for (kind, _, n), o in kube.objects.items() if kind == "PodDisruptionBudget"}
    assert {n: b["spec"]["minAvailable"] for n, b in budgets.items()} == {
        "res-h100-80gb-hbm3": 0, "res-l40s": 0}
    for name, budget in budgets.items():
        deploy = kube.objects[("Deployment", "ml", name)]
        assert budget["spec"]["selector"] == deploy["spec"]["selector"]
        assert budget["metadata"]["ownerReferences"] == deploy["metadata"]["ownerReferences"]
    body = view.resources[KEY]
    body["spec"] = {**SPEC, "speculative": {"numSpeculativeTokens": 3}}
    body["metadata"]["generation"] = 2
    await rec.reconcile(KEY)
    deploys = kube.deployments()
    assert deploys[H100]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1,
                                                                  "maxUnavailable": 0}
    assert deploys[L40S]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0,
                                                                  "maxUnavailable": 1}
    message = kube.events[-1][2]
    assert kube.events[-1][1] == "PoolRollout"
    assert f"pool {H100}: surge: a spare slot on {H100} (8 of 16 GPUs" in message
    assert f"pool {L40S}: no spare slot on {L40S} (0 of 8 GPUs" in message
    assert kube.count("apply_pdb") == 2  # not again: same minAvailable
    view.deliver(kube, ready=True)
    body["spec"] = {**SPEC, "speculative": {"numSpeculativeTokens": 3}, "replicas": 2}
    body["metadata"]["generation"] = 3
    await rec.reconcile(KEY)
    budgets = {n: o for (kind, _, n), o in kube.objects.items() if kind == "PodDisruptionBudget"}
    assert {n: b["spec"]["minAvailable"] for n, b in budgets.items()} == {
        "res-h100-80gb-hbm3": 1, "res-l40s": 1}
    assert kube.count("apply_pdb") == 4
    # a scale rolls no pod: the strategies the rollouts began with are kept
    deploys = kube.deployments()
    assert deploys[H100]["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 1
    assert deploys[L40S]["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


async def test_a_scale_and_a_k_change_in_one_pass_count_the_new_size() -> None:
    """A scale 1 -> 2 and a change of K that reach the operator as one spec (the watch had
    not delivered the scale yet): the room is counted with the pool at 2 replicas, 16 of the
    node's 16 GPUs, so there is no spare slot and one old pod goes first. Counting the watched
    1 replica would surge a pod the node has no GPUs for."""
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100, gpus=16)])
    view.add(mtpinference("res", {**SPEC, "gpuProducts": [H100]}))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    body = view.resources[KEY]
    body["spec"] = {**SPEC, "gpuProducts": [H100], "replicas": 2,
                    "speculative": {"numSpeculativeTokens": 1}}
    body["metadata"]["generation"] = 2
    await rec.reconcile(KEY)
    deploy = kube.deployments()[H100]
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert f"no spare slot on {H100} (0 of 16 GPUs" in kube.events[-1][2]


async def test_a_removed_pool_takes_its_disruption_budget_with_it() -> None:
    """A pool taken out of gpuProducts is deleted and so is its PodDisruptionBudget (it would
    select no pod and stay until the resource goes); the other pool's budget stays. A refused
    budget delete (RBAC of an older install) does not fail the pass."""
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100, gpus=16), node("l1", L40S)])
    view.add(mtpinference("res", SPEC))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    budgets = {n for (kind, _, n) in kube.objects if kind == "PodDisruptionBudget"}
    assert budgets == {"res-h100-80gb-hbm3", "res-l40s"}
    body = view.resources[KEY]
    body["spec"] = {**SPEC, "gpuProducts": [H100]}
    body["metadata"]["generation"] = 2
    await rec.reconcile(KEY)
    assert ("delete_deployment", "res-l40s") in kube.calls
    assert ("delete_pdb", "res-l40s") in kube.calls
    assert {n for (kind, _, n) in kube.objects if kind == "PodDisruptionBudget"} == {
        "res-h100-80gb-hbm3"}
    view.deliver(kube, ready=True)
    kube.fail["delete_pdb"] = api_error(403, "poddisruptionbudgets is forbidden")
    body["spec"] = {**SPEC, "gpuProducts": [L40S]}
    body["metadata"]["generation"] = 3
    await rec.reconcile(KEY)
    assert ("delete_deployment", "res-h100-80gb-hbm3") in kube.calls
    assert KEY in kube.statuses and set(kube.deployments()) == {L40S}


async def test_a_refused_disruption_budget_does_not_fail_the_pool_write(cluster) -> None:
    """An install whose RBAC predates budgets: the PDB apply gets 403, the pools are written
    and the pass succeeds; the budget is tried again with the pool's next write."""
    kube, view, rec = cluster
    kube.fail["apply_pdb"] = api_error(403, "poddisruptionbudgets is forbidden")
    await rec.reconcile(KEY)
    assert set(kube.deployments()) == {H100, L40S}
    assert KEY in kube.statuses
    written = {n for (kind, _, n) in kube.objects if kind == "PodDisruptionBudget"}
    assert len(written) == 1  # the one refusal: one of the two pools has none yet
    view.deliver(kube, ready=True)
    body = view.resources[KEY]
    body["spec"] = {**SPEC, "speculative": {"numSpeculativeTokens": 3}}
    body["metadata"]["generation"] = 2
    await rec.reconcile(KEY)
    assert {n for (kind, _, n) in kube.objects if kind == "PodDisruptionBudget"} == {
        d["metadata"]["name"] for d in kube.deployments().values()}
    # recorded when they succeed: the first pass's one, then the refused one again (the
    # other, written with its minAvailable already, is not written twice)
    assert kube.count("apply_pdb") == 2
