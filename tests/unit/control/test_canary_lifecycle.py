"""A tuning canary exists only while a live trial names it (issue 36, defects 1-3): every pass
compares the canary pods the watch shows (and the ones it made itself) with the canaries its
plan wants, by name and pod template; one without a live trial is deleted with an Event
saying why, one deleted by hand is made again, one whose template changed is deleted (a pod's
spec cannot be changed: patching it is a 422) and made again once gone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from lightkube import ApiError

from mtp_operator.api.tuning import PoolTuningStatus, TuningTrial
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.control.rollback import RollbackActions
from mtp_operator.reconcile_plan import Fold
from mtp_operator.rollback.signals import AlertSignal, PoolRef
from mtp_operator.settings import OperatorSettings
from support.fake_cluster import FakeKube, FakeView, mtpinference, node

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
KEY = ("ml", "res")
CANARY = "res-h100-80gb-hbm3-canary-k1"
POD = ("Pod", "ml", CANARY)


def spec(replicas: int = 2, mode: str = "Auto") -> dict[str, Any]:
    return {"model": "org/model", "tensorParallelSize": 8, "replicas": replicas,
            "speculative": {"maxSpeculativeTokens": 4, "tuning": {
                "mode": mode, "candidates": [1, 4]}}}


def trial_entry(trial: bool = True, generation: int = 1) -> PoolTuningStatus:
    return PoolTuningStatus(
        mode="Auto", generation=generation,
        trial=TuningTrial(k=1, from_k=4, kind="canary", started="2026-12-01T08:00:00Z")
        if trial else None,
    )


async def canary_running(settings: OperatorSettings | None = None):
    """A resource of 2 replicas whose H100 pool (K=4) runs a canary trial of K=1, the canary
    pod made and shown by the watch. Returns (kube, view, reconciler); calls and events
    cleared."""
    kube = FakeKube()
    view = FakeView(nodes=[node("h1", H100), node("h2", H100)])
    view.add(mtpinference("res", spec()))
    rec = Reconciler(kube, view, settings or OperatorSettings(), clock=lambda: T0)
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    await rec.reconcile_locked(KEY, Fold(tuning={H100: trial_entry()}))
    view.deliver(kube, ready=True)
    await rec.reconcile(KEY)  # a pass that sees the canary in the watch
    view.deliver(kube, ready=True)
    assert POD in kube.objects and CANARY in view.canary_pods(KEY)
    kube.calls.clear()
    kube.events.clear()
    return kube, view, rec


def deleted_events(kube: FakeKube) -> list[str]:
    return [m for _, reason, m, _ in kube.events if reason == "TuningCanaryDeleted"]


@pytest.mark.parametrize(
    ("new_spec", "why"),
    [
        (spec(mode="Off"), "tuning is Off"),
        (spec(replicas=1), "replicas 1"),
        ({**spec(), "image": "registry.example/vllm:2"}, "the spec changed"),
    ],
    ids=["tuning-off", "one-replica", "spec-edit"],
)
async def test_a_spec_edit_that_ends_the_trial_deletes_the_canary(new_spec, why) -> None:
    kube, view, rec = await canary_running()
    view.add(mtpinference("res", new_spec, generation=2))
    await rec.reconcile(KEY)
    assert ("delete_pod", CANARY) in kube.calls and POD not in kube.objects
    (said,) = deleted_events(kube)
    assert CANARY in said and H100 in said and why in said, said
    view.deliver(kube, ready=True)
    kube.calls.clear()
    await rec.reconcile(KEY)
    assert not [c for c in kube.calls if c[1] == CANARY]  # and never made again


async def test_a_trial_ended_by_a_spec_edit_is_recorded_in_status() -> None:
    """Defect 3: the trial the spec edit ended is kept in the pool's tuning history as
    `superseded` (ended at the pass, with the generations named), and the new generation's
    entry starts over: no trial, no tuned K, nothing measured. An edit that switches tuning
    Off keeps no tuning entry at all (as before)."""
    kube, view, rec = await canary_running()
    view.add(mtpinference("res", {**spec(), "image": "registry.example/vllm:2"},
                          generation=2))
    await rec.reconcile(KEY)
    (pool,) = kube.statuses[KEY]["pools"]
    tuning = pool["tuning"]
    assert tuning["generation"] == 2 and "trial" not in tuning and "tunedK" not in tuning
    (ended,) = tuning["trials"]
    assert (ended["k"], ended["fromK"], ended["kind"]) == (1, 4, "canary")
    assert ended["started"] == "2026-12-01T08:00:00Z" and ended["ended"] == "2026-12-01T08:00:00Z"
    assert ended["outcome"] == "superseded" and "generation 1 -> 2" in ended["reason"]
    (said,) = deleted_events(kube)
    assert "the spec changed" in said, said
    view.deliver(kube, ready=True)
    await rec.reconcile(KEY)  # the next pass keeps the entry (same generation now)
    assert kube.statuses[KEY]["pools"][0]["tuning"]["trials"] == [ended]
    off_kube, off_view, off_rec = await canary_running()
    off_view.add(mtpinference("res", spec(mode="Off"), generation=2))
    await off_rec.reconcile(KEY)
    assert "tuning" not in off_kube.statuses[KEY]["pools"][0]


async def test_a_rollback_of_the_pool_deletes_its_canary() -> None:
    kube, view, rec = await canary_running()
    actions = RollbackActions(kube, view, rec, clock=lambda: T0)
    signal = AlertSignal("MTPHitRateLow", "firing", PoolRef("ml", "res", H100), 0.5, 0.88,
                         "alertmanager")
    assert (await actions.apply_signals([signal])).rolled_back == 1
    assert ("delete_pod", CANARY) in kube.calls
    (said,) = deleted_events(kube)
    assert "rolled back" in said, said


async def test_a_canary_no_trial_names_is_deleted_by_a_fresh_operator() -> None:
    """After a restart (a new reconciler: no memory of the canary it made) a pass that finds
    the canary pod in the watch while no live trial names it deletes it."""
    kube, view, _rec = await canary_running()
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    await rec.reconcile_locked(KEY, Fold(tuning={H100: trial_entry(trial=False)}))
    assert ("delete_pod", CANARY) in kube.calls
    (said,) = deleted_events(kube)
    assert "no live trial names it" in said, said


async def test_a_canary_deleted_by_hand_is_made_again() -> None:
    kube, view, rec = await canary_running()
    del kube.objects[POD]
    view.deliver(kube, ready=True)  # the watch: the pod is gone
    await rec.reconcile(KEY)
    assert ("apply", CANARY) in kube.calls and POD in kube.objects


async def test_a_canary_whose_template_changed_is_replaced_not_patched() -> None:
    """The pod template changes under a live trial (here the operator's default image, as an
    operator upgrade does): patching the pod is a 422 (its spec is immutable), so the pass
    deletes it and makes it again from the new template once the watch shows it gone."""
    kube, view, _rec = await canary_running()
    old_image = kube.objects[POD]["spec"]["containers"][0]["image"]
    rec = Reconciler(kube, view, OperatorSettings(default_image="registry.example/rt:2"),
                     clock=lambda: T0)
    await rec.reconcile(KEY)  # no exception: no 422
    assert [c for c in kube.calls if c[1] == CANARY] == [("delete_pod", CANARY)]
    (said,) = deleted_events(kube)
    assert "pod template changed" in said, said
    view.deliver(kube, ready=True)
    await rec.reconcile(KEY)
    assert ("apply", CANARY) in kube.calls
    image = kube.objects[POD]["spec"]["containers"][0]["image"]
    assert (old_image, image) != (image, image) and image == "registry.example/rt:2"


async def test_patching_a_pods_spec_is_refused_as_the_api_server_does() -> None:
    """The fake answers a changed pod spec as the API server does (422), so the test above
    would see a patch."""
    kube = FakeKube()
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": [{"image": "a"}]}}
    await kube.apply(pod)
    with pytest.raises(ApiError) as refused:
        await kube.apply({**pod, "spec": {"containers": [{"image": "b"}]}})
    assert refused.value.status.code == 422
