"""control/rollback.py over an in-memory cluster and a frozen clock: signals become decisions,
one reconcile pass persists them (the one status write) and rolls exactly the affected pool."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mtp_operator.adapters import kube as kube_adapter
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.control.rollback import NotReady, RollbackActions
from mtp_operator.naming import ANNOTATION_COMMAND, ANNOTATION_RESET_ROLLBACK
from mtp_operator.rollback.signals import AlertSignal, PoolRef
from mtp_operator.settings import OperatorSettings
from support.fake_cluster import FakeKube, FakeView, mtpinference, node

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
KEY = ("ml", "res")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def k_of(deployment: dict[str, Any]) -> int:
    argv = json.loads(deployment["metadata"]["annotations"][ANNOTATION_COMMAND])
    if "--speculative-config" not in argv:
        return 0
    return json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]


def low_hit_rate(product: str = H100, value: float = 0.6, name: str = "res") -> AlertSignal:
    return AlertSignal(
        "MTPHitRateLow", "firing", PoolRef("ml", name, product), value, 0.88, "alertmanager"
    )


@pytest.fixture
async def serving() -> tuple[FakeKube, FakeView, RollbackActions, Clock]:
    """A resource with an H100 pool (K 6) and an L40S pool (K 2), rolled out and watched."""
    return await rolled_out([H100, L40S], {})


async def rolled_out(products: list[str], spec: dict[str, Any]):
    """One resource rolled out and watched on one node per product; calls and events
    cleared. Returns (kube, view, actions, clock)."""
    clock = Clock()
    kube = FakeKube()
    view = FakeView(nodes=[node(f"n{i}", p) for i, p in enumerate(products)])
    view.add(mtpinference("res", {"model": "org/model", "tensorParallelSize": 8, **spec}))
    reconciler = Reconciler(kube, view, OperatorSettings(), clock=clock)
    await reconciler.reconcile(KEY)
    view.deliver(kube, ready=True)
    await reconciler.reconcile(KEY)
    view.deliver(kube, ready=True)
    kube.calls.clear()
    kube.events.clear()
    return kube, view, RollbackActions(kube, view, reconciler, clock=clock), clock


async def test_a_firing_alert_steps_one_pool_down(serving) -> None:
    kube, _view, actions, _clock = serving
    outcome = await actions.apply_signals([low_hit_rate()])
    assert (outcome.rolled_back, outcome.unchanged, outcome.unknown) == (1, 0, [])
    assert {p: k_of(d) for p, d in kube.deployments().items()} == {H100: 5, L40S: 2}
    # the pool and the status (its PodDisruptionBudget was written when it was made)
    assert kube.calls == [("apply", "res-h100-80gb-hbm3"), ("patch_status", "res")]
    status = kube.statuses[KEY]
    h100 = next(p for p in status["pools"] if p["gpuProduct"] == H100)
    assert (h100["numSpeculativeTokens"], h100["source"], h100["rollbackK"]) == (5, "rollback", 5)
    assert h100["rollbackGeneration"] == 1 and h100["lastRollbackTime"] == "2026-11-29T12:00:00Z"
    assert status["rollbacks"] == [
        {
            "time": "2026-11-29T12:00:00Z",
            "gpuProduct": H100,
            "fromK": 6,
            "toK": 5,
            "alert": "MTPHitRateLow",
            "value": 0.6,
            "threshold": 0.88,
            "reason": "MTPHitRateLow 0.6 < 0.88: stepped K down 6->5",
            "via": "alertmanager",
        }
    ]
    rolled = next(c for c in status["conditions"] if c["type"] == "SpeculationRolledBack")
    assert rolled["status"] == "True"
    # one Event for the pool's change: the rollback's (no PoolUpdated beside it), and how
    # its pods are replaced: one 8-GPU node, one 8-GPU replica, no spare slot (issue 37)
    assert [e[1] for e in kube.events] == ["PoolRollout", "SpeculationRolledBack"]
    assert kube.events[0][2].startswith(f"pool {H100}: no spare slot on {H100} (0 of 8 GPUs")
    assert kube.events[-1][1:] == (
        "SpeculationRolledBack",
        f"pool {H100}: K 6 -> 5 (MTPHitRateLow 0.6 < 0.88: stepped K down 6->5, via alertmanager)",
        "Warning",
    )


async def test_a_rollback_pass_writes_as_urgent_and_an_ordinary_one_does_not(
    serving, monkeypatch
) -> None:
    """The writes for an alert skip the bulk transport (adapters/kube.py, `urgent_writes`):
    the pool write, the status write and the Event alike; an ordinary pass's do not."""
    kube, view, actions, _clock = serving
    urgent: list[tuple[str, bool]] = []
    for name in ("apply", "patch_status", "event"):
        real = getattr(kube, name)

        async def spy(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            urgent.append((_name, kube_adapter.writes_are_urgent()))
            return await _real(*a, **kw)

        monkeypatch.setattr(kube, name, spy)
    await actions.apply_signals([low_hit_rate()])
    assert urgent == [("apply", True), ("event", True), ("patch_status", True),
                      ("event", True)]  # the pool, PoolRollout, the status, the rollback's
    urgent.clear()
    view.deliver(kube, ready=True)
    view.add(mtpinference("res", {"model": "org/model", "tensorParallelSize": 8, "replicas": 2}))
    await actions.reconciler.reconcile(KEY)  # a spec edit: an ordinary pass
    assert urgent and not any(flag for _, flag in urgent)


async def test_a_repeat_within_the_cooldown_changes_no_k(serving) -> None:
    kube, view, actions, clock = serving
    await actions.apply_signals([low_hit_rate()])
    view.deliver(kube, ready=True)
    clock.now = T0 + timedelta(seconds=60)  # cooldown 600 s
    outcome = await actions.apply_signals([low_hit_rate(value=0.5)])
    assert (outcome.rolled_back, outcome.unchanged) == (0, 1)
    assert k_of(kube.deployments()[H100]) == 5
    h100 = next(p for p in kube.statuses[KEY]["pools"] if p["gpuProduct"] == H100)
    assert h100["lastAlertTime"] == "2026-11-29T12:01:00Z"  # recorded all the same
    assert len(kube.statuses[KEY]["rollbacks"]) == 1
    clock.now = T0 + timedelta(seconds=601)
    assert (await actions.apply_signals([low_hit_rate()])).rolled_back == 1
    assert k_of(kube.deployments()[H100]) == 4


async def test_two_signals_for_one_pool_in_one_batch_roll_it_once(serving) -> None:
    kube, _view, actions, _clock = serving
    outcome = await actions.apply_signals([low_hit_rate(), low_hit_rate(value=0.4)])
    assert (outcome.rolled_back, outcome.unchanged) == (1, 1)
    assert k_of(kube.deployments()[H100]) == 5
    assert kube.count("patch_status") == 1  # the one writer, once


async def test_with_no_cooldown_each_signal_of_a_batch_steps_from_the_one_before() -> None:
    # cooldownSeconds 0: three alerts for one pool in one body act as three in a row would
    # (6 -> 5 -> 4 -> 3), each recorded once with its own from/to K; not three times 6 -> 5
    kube, view, actions, _clock = await rolled_out([H100], {"rollback": {"cooldownSeconds": 0}})
    outcome = await actions.apply_signals([low_hit_rate(value=v) for v in (0.6, 0.5, 0.4)])
    assert (outcome.rolled_back, outcome.unchanged) == (3, 0)
    assert k_of(kube.deployments()[H100]) == 3
    steps = [(r["fromK"], r["toK"]) for r in kube.statuses[KEY]["rollbacks"]]
    assert steps == [(6, 5), (5, 4), (4, 3)]
    # one Event for the pool, naming the whole step (status.rollbacks has each one)
    rolled = [e for e in kube.events if e[1] == "SpeculationRolledBack"]
    assert len(rolled) == 1
    assert rolled[0][2].startswith(f"pool {H100}: K 6 -> 3 in 3 steps (last: ")
    assert kube.count("patch_status") == 1
    # at K=0 more alerts change nothing and record nothing
    view.deliver(kube, ready=True)
    outcome = await actions.apply_signals([low_hit_rate() for _ in range(5)])
    assert (outcome.rolled_back, outcome.unchanged) == (3, 2)
    assert k_of(kube.deployments()[H100]) == 0
    assert len(kube.statuses[KEY]["rollbacks"]) == 6

async def test_requests_waiting_for_one_resource_are_written_in_one_pass(serving) -> None:
    # two requests (one per pool) arrive while the resource's lock is held: the first to get
    # it decides and writes both (group commit); each request keeps its own outcome
    import asyncio

    kube, _view, actions, _clock = serving
    async with actions.reconciler.slot(KEY).turn.lock:
        first = asyncio.create_task(actions.apply_signals([low_hit_rate(H100)]))
        second = asyncio.create_task(actions.apply_signals([low_hit_rate(L40S), low_hit_rate(
            "NVIDIA-B200")]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not first.done() and not second.done()
    a, b = await asyncio.gather(first, second)
    assert (a.rolled_back, a.unchanged, a.unknown) == (1, 0, [])
    assert (b.rolled_back, b.unchanged, b.unknown) == (1, 0, ["ml/res/NVIDIA-B200"])
    assert {p: k_of(d) for p, d in kube.deployments().items()} == {H100: 5, L40S: 1}
    assert kube.count("patch_status") == 1  # one pass for both requests
    assert [(r["gpuProduct"], r["fromK"], r["toK"]) for r in kube.statuses[KEY]["rollbacks"]] \
        == [(H100, 6, 5), (L40S, 2, 1)]
    assert [e[1] for e in kube.events].count("SpeculationRolledBack") == 2

async def test_alerts_within_the_resource_threshold_and_unknown_targets(serving) -> None:
    kube, _view, actions, _clock = serving
    outcome = await actions.apply_signals(
        [
            low_hit_rate(value=0.95),  # healthy by the resource's 0.88
            low_hit_rate(product="NVIDIA-B200"),
            low_hit_rate(value=0.1, name="other"),
        ]
    )
    assert (outcome.rolled_back, outcome.unchanged) == (0, 1)
    assert sorted(outcome.unknown) == ["ml/other", "ml/res/NVIDIA-B200"]
    assert kube.calls == [] and kube.events == []


async def test_a_reset_annotation_undoes_the_pin_once(serving) -> None:
    kube, view, actions, _clock = serving
    await actions.apply_signals([low_hit_rate()])
    view.deliver(kube, ready=True)
    view.resources[KEY]["metadata"]["annotations"] = {ANNOTATION_RESET_ROLLBACK: "t1"}
    await actions.reconciler.reconcile(KEY)
    assert k_of(kube.deployments()[H100]) == 6
    assert kube.statuses[KEY]["rollbackResetToken"] == "t1"
    view.deliver(kube, ready=True)
    # a later rollback is not undone by the token already acted on
    actions.clock.now = T0 + timedelta(seconds=601)
    await actions.apply_signals([low_hit_rate()])
    view.deliver(kube, ready=True)
    await actions.reconciler.reconcile(KEY)
    assert k_of(kube.deployments()[H100]) == 5


async def test_nothing_happens_before_the_first_listing(serving) -> None:
    kube, view, actions, _clock = serving
    view.listed = False
    with pytest.raises(NotReady):
        await actions.apply_signals([low_hit_rate()])
    assert kube.calls == []


async def test_requests_arriving_together_share_one_pass(serving) -> None:
    # nothing holds the lock: the first request waits a few ms for the ones arriving with it
    # (a burst, one alert per pool), and one pass decides and writes them all
    import asyncio

    kube, _view, actions, _clock = serving
    first = asyncio.create_task(actions.apply_signals([low_hit_rate(H100)]))
    await asyncio.sleep(0.001)  # the second arrives a millisecond later
    second = asyncio.create_task(actions.apply_signals([low_hit_rate(L40S)]))
    a, b = await asyncio.gather(first, second)
    assert (a.rolled_back, b.rolled_back) == (1, 1)
    assert {p: k_of(d) for p, d in kube.deployments().items()} == {H100: 5, L40S: 1}
    assert kube.count("patch_status") == 1  # one pass for both requests


async def test_a_lone_request_waits_only_for_the_quiet_time(serving) -> None:
    import asyncio

    from mtp_operator.control.rollback import BATCH_GATHER_SECONDS

    kube, _view, actions, _clock = serving
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    outcome = await actions.apply_signals([low_hit_rate(H100)])
    assert outcome.rolled_back == 1 and k_of(kube.deployments()[H100]) == 5
    assert loop.time() - t0 < BATCH_GATHER_SECONDS  # it did not wait for the cap


async def test_a_wide_request_leaves_room_for_the_requests_beside_it() -> None:
    # One body naming 20 resources (Alertmanager grouping a fleet) runs WIDE_REQUEST_PASSES
    # of its passes at a time; a single alert for another resource, sent while the wide one
    # is being written, is patched after at most those passes' writes, not after all 20.
    import asyncio

    from mtp_operator.control.rollback import WIDE_REQUEST_PASSES, WIDE_REQUEST_RESOURCES

    clock = Clock()
    kube = FakeKube()
    view = FakeView(nodes=[node("n0", H100)])
    names = [f"r{i:02d}" for i in range(20)] + ["side"]
    assert len(names) - 1 > WIDE_REQUEST_RESOURCES
    for name in names:
        view.add(mtpinference(name, {"model": "org/model", "tensorParallelSize": 8}))
    reconciler = Reconciler(kube, view, OperatorSettings(), clock=clock)
    for name in names:
        await reconciler.reconcile(("ml", name))
    view.deliver(kube, ready=True)
    kube.calls.clear()

    in_flight, most, order = 0, 0, []
    plain_apply = kube.apply

    async def slow_apply(obj):  # each pool write takes 10 ms of the API server
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.01)
            return await plain_apply(obj)
        finally:
            in_flight -= 1
            order.append(obj["metadata"]["name"])

    kube.apply = slow_apply
    actions = RollbackActions(kube, view, reconciler, clock=clock)
    wide = asyncio.create_task(
        actions.apply_signals([low_hit_rate(name=n) for n in names[:-1]])
    )
    await asyncio.sleep(0.015)  # the wide request's first passes are writing
    side = await actions.apply_signals([low_hit_rate(name="side")])
    outcome = await wide
    assert side.rolled_back == 1 and outcome.rolled_back == 20
    assert most <= WIDE_REQUEST_PASSES + 1, most  # its passes, and the side request's
    # the side pool was written before most of the wide request's pools: after at most the
    # passes under way when it arrived (15 ms: the first round's writes of 3 + 10 ms are done,
    # the second round's under way), not after all 20
    assert order.index("side-h100-80gb-hbm3") <= 2 * WIDE_REQUEST_PASSES, order


async def test_a_rollback_write_does_not_wait_behind_a_rollouts_writes(serving) -> None:
    """Ordinary passes' Deployment and Service writes take turns (at most
    BULK_WRITES_IN_FLIGHT at once); a pass that rolls a pool back writes at once, even while
    every turn is taken by writes the API server has not answered yet."""
    import asyncio

    kube, view, actions, _clock = serving
    reconciler = actions.reconciler
    reconciler.writes.pools.bulk_writes = asyncio.Semaphore(2)
    gate = asyncio.Event()
    real_apply = kube.apply
    in_flight: list[str] = []
    most = [0]

    async def apply(obj):
        name = obj["metadata"]["name"]
        if not name.startswith("res-"):  # the rollout's objects wait for the gate
            in_flight.append(name)
            most[0] = max(most[0], len(in_flight))
            try:
                await gate.wait()
            finally:
                in_flight.remove(name)
        return await real_apply(obj)

    kube.apply = apply
    others = [f"other{i}" for i in range(3)]  # 3 new resources: 3 Services, 6 Deployments
    for name in others:
        view.add(mtpinference(name, {"model": "org/model", "tensorParallelSize": 8}))
    rollout = [asyncio.create_task(reconciler.reconcile(("ml", n))) for n in others]
    for _ in range(100):
        await asyncio.sleep(0)
    assert len(in_flight) == 2  # two turns, both taken
    outcome = await asyncio.wait_for(actions.apply_signals([low_hit_rate()]), 5)
    assert outcome.rolled_back == 1 and k_of(kube.deployments()[H100]) == 5
    assert len(in_flight) == 2  # still waiting: the rollback did not take a turn
    gate.set()
    await asyncio.gather(*rollout)
    assert most[0] == 2
    created = {name for (kind, _ns, name) in kube.objects if kind == "Deployment"}
    assert sum(n.startswith("other") for n in created) == 6


# ---- hardening (issue 36) -------------------------------------------------------------------


async def test_unknown_targets_cost_no_memory_and_little_time(serving) -> None:
    """Alerts naming resources the operator does not know leave nothing behind: no reconcile
    slot, no waiting entry, no pass (each used to cost a ~2.4 KB slot kept for ever and a
    pass's quiet wait, one at a time: 20,000 such alerts took ~66 s)."""
    kube, _view, actions, _clock = serving
    slots = len(actions.reconciler._slots)
    t0 = time.perf_counter()
    for round_ in range(2):
        signals = [low_hit_rate(name=f"gone-{round_}-{i}") for i in range(10_000)]
        outcome = await actions.apply_signals(signals)
        assert len(outcome.unknown) == 10_000 and outcome.rolled_back == 0
        assert len(actions.reconciler._slots) == slots  # flat
        assert not actions._waiting
    took = time.perf_counter() - t0
    assert took < 5.0, took  # linear and cheap: no 3 ms wait per unknown resource
    assert kube.calls == [] and kube.events == []


async def test_a_resource_deleted_during_a_request_leaves_no_slot(serving) -> None:
    _kube, view, actions, _clock = serving
    async with actions.reconciler.slot(KEY).turn.lock:
        task = asyncio.create_task(actions.apply_signals([low_hit_rate()]))
        for _ in range(5):
            await asyncio.sleep(0)
        # the watch's DELETED event, as app/handlers.resource_changed handles it
        del view.resources[KEY]
        actions.reconciler.forget(KEY)
    outcome = await task
    assert outcome.unknown == ["ml/res"] and outcome.rolled_back == 0
    assert KEY not in actions.reconciler._slots
    assert not actions._waiting


async def test_a_large_valid_body_takes_time_linear_in_its_size(serving) -> None:
    _kube, _view, actions, _clock = serving

    def signals(n: int) -> list[AlertSignal]:
        return [low_hit_rate(H100 if i % 2 else L40S, value=0.5 + (i % 97) / 1000)
                for i in range(n)]

    async def took(n: int) -> float:
        t0 = time.perf_counter()
        outcome = await actions.apply_signals(signals(n))
        assert outcome.rolled_back + outcome.unchanged == n
        return time.perf_counter() - t0

    await took(100)  # the first rollbacks (and their cooldown) out of the way
    # best of 2 against a busy machine; 8x the alerts: linear ~8x, quadratic ~64x
    t_small = min([await took(500), await took(500)])
    t_large = min([await took(4000), await took(4000)])
    assert t_large < 24 * t_small + 0.5, (t_small, t_large)


@pytest.mark.parametrize("field", ["settingsSince", "lastRollbackTime", "lastAlertTime"])
@pytest.mark.parametrize(
    "bad", ["yesterday", "2026-13-45T00:00:00Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"]
)
async def test_a_bad_time_in_a_pools_status_is_read_as_absent(
    serving, field: str, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A time in status.pools[] that is not RFC 3339 (hand-edited, another writer) or that no
    duration can be added to without overflow (year 9999, year 1) is read as absent and said
    in a log naming the resource, the pool and the field; the alert is acted on as if the
    field were unset (no rollback before: no cooldown), never raised (the webhook's 500,
    issue 36)."""
    kube, view, actions, _clock = serving
    body = view.resources[KEY]
    pool = next(p for p in body["status"]["pools"] if p["gpuProduct"] == H100)
    pool[field] = bad
    caplog.set_level(logging.WARNING, logger="mtp_operator")
    outcome = await actions.apply_signals([low_hit_rate()])
    assert (outcome.rolled_back, outcome.unchanged, outcome.unknown) == (1, 0, [])
    assert k_of(kube.deployments()[H100]) == 5
    said = [r.getMessage() for r in caplog.records if field in r.getMessage()]
    assert said and "ml/res" in said[0] and H100 in said[0] and repr(bad) in said[0], said
    written = next(p for p in kube.statuses[KEY]["pools"] if p["gpuProduct"] == H100)
    assert written.get(field) != bad  # the next write replaces it


async def test_one_resource_whose_state_cannot_be_read_does_not_fail_the_request(
    monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A state error (ValueError and kin) while deciding for one resource ends that
    resource's share of the request, logged with its name; the other resource of the same
    body is rolled back and apply_signals returns (the webhook answers 200, not the 500
    Alertmanager retries for ever; issue 36)."""
    from mtp_operator.control import rollback as control_rollback

    kube, view, actions, _clock = await rolled_out([H100], {})
    view.add(mtpinference("other", {"model": "org/model", "tensorParallelSize": 8}))
    await actions.reconciler.reconcile(("ml", "other"))
    view.deliver(kube, ready=True)
    real = control_rollback.decide_rollback

    def decide_rollback(state, signal, *a, **kw):
        if signal.target.mtpinference == "res":
            raise ValueError("a state nobody foresaw")
        return real(state, signal, *a, **kw)

    monkeypatch.setattr(control_rollback, "decide_rollback", decide_rollback)
    caplog.set_level(logging.WARNING, logger="mtp_operator")
    outcome = await actions.apply_signals([low_hit_rate(), low_hit_rate(name="other")])
    assert (outcome.rolled_back, outcome.unchanged, outcome.unknown) == (1, 1, [])
    assert [r.getMessage() for r in caplog.records if "ml/res" in r.getMessage()] == [
        "ml/res: 1 alert(s) not acted on: the resource's state could not be read"
    ]
    ks = {name: k_of(o) for (kind, _, name), o in kube.objects.items() if kind == "Deployment"}
    assert ks == {"res-h100-80gb-hbm3": 6, "other-h100-80gb-hbm3": 5}


# Traffic classes (issue 39): an alert names a class pool by `traffic_class` beside
# `gpu_product`, as the shipped rules (grouped by both) and the PodMonitor's relabelling give it.
CLASSES = {"speculative": {"classes": [
    {"name": "short", "promptTokens": {"max": 127}, "numSpeculativeTokens": 4},
    {"name": "long", "promptTokens": {"min": 128}, "numSpeculativeTokens": 2},
]}}


def webhook_signals(*labels: dict[str, str]) -> list[AlertSignal]:
    """Alertmanager's body for firing MTPHitRateLow alerts (hit rate 0.6) with these pool
    labels, through the receiver's parser."""
    from mtp_operator.rollback.alertmanager import parse_webhook

    body = {"version": "4", "alerts": [
        {"status": "firing", "fingerprint": str(i),
         "labels": {"alertname": "MTPHitRateLow", "namespace": "ml", "mtpinference": "res", **x},
         "annotations": {"value": "0.6", "threshold": "0.88"}}
        for i, x in enumerate(labels)
    ]}
    parsed = parse_webhook(json.dumps(body).encode())
    assert not parsed.ignored
    return parsed.signals


async def test_an_alert_with_a_class_label_rolls_back_that_class_pool_only() -> None:
    kube, _view, actions, _clock = await rolled_out([H100, L40S], CLASSES)
    pools = {f"{p}/{c}" for p in (H100, L40S) for c in ("short", "long")}
    before = {p: k_of(d) for p, d in kube.deployments().items()}
    assert before == {p: 4 if p.endswith("/short") else 2 for p in pools}
    outcome = await actions.apply_signals(
        webhook_signals({"gpu_product": H100, "traffic_class": "long"})
    )
    assert (outcome.rolled_back, outcome.unchanged, outcome.unknown) == (1, 0, [])
    assert {p: k_of(d) for p, d in kube.deployments().items()} == {**before, f"{H100}/long": 1}
    (rec,) = kube.statuses[KEY]["rollbacks"]
    assert (rec["gpuProduct"], rec.get("trafficClass"), rec["fromK"], rec["toK"]) == (
        H100, "long", 2, 1)
    pool = next(p for p in kube.statuses[KEY]["pools"]
                if (p["gpuProduct"], p.get("trafficClass")) == (H100, "long"))
    assert pool["rollbackK"] == 1
    assert kube.events[-1][1:] == (
        "SpeculationRolledBack",
        f"pool {H100}/long: K 2 -> 1 (MTPHitRateLow 0.6 < 0.88: stepped K down 2->1, "
        "via alertmanager)",
        "Warning",
    )


async def test_a_class_pools_alert_without_its_class_names_no_pool() -> None:
    # rules that do not keep classes apart sum every class pool of the product into one
    # series: such an alert names no pool (the resource has no unclassed pool) and rolls
    # nothing back; nor does a class the resource does not have
    kube, _view, actions, _clock = await rolled_out([H100], CLASSES)
    outcome = await actions.apply_signals(webhook_signals(
        {"gpu_product": H100}, {"gpu_product": H100, "traffic_class": "mid"}))
    assert (outcome.rolled_back, outcome.unchanged) == (0, 0)
    assert sorted(outcome.unknown) == [f"ml/res/{H100}", f"ml/res/{H100}/mid"]
    assert kube.calls == [] and kube.events == []


async def test_a_cut_product_label_and_a_class_name_the_class_pool() -> None:
    # a GPU product over 63 characters is cut and hashed in the pods' label (so in the
    # alert); with a class the alert still finds its pool
    from mtp_operator.naming import label_value

    product = "NVIDIA-" + "X" * 80
    kube, _view, actions, _clock = await rolled_out([product], CLASSES)
    assert label_value(product) != product
    outcome = await actions.apply_signals(
        webhook_signals({"gpu_product": label_value(product), "traffic_class": "short"})
    )
    assert (outcome.rolled_back, outcome.unknown) == (1, [])
    assert {p: k_of(d) for p, d in kube.deployments().items()} == {
        f"{product}/short": 3, f"{product}/long": 2}


# ---- spec.rollback.alertNames / alertMatchers: which alerts may roll a resource back --------


def labelled_alert(alert: str, **labels: str) -> list[AlertSignal]:
    """A firing webhook alert for the H100 pool (value past either default threshold) with
    extra labels, through the receiver's parser."""
    from mtp_operator.rollback.alertmanager import parse_webhook

    value = "0.6" if alert == "MTPHitRateLow" else "0.9"
    body = {"version": "4", "alerts": [{
        "status": "firing",
        "labels": {"alertname": alert, "namespace": "ml", "mtpinference": "res",
                   "gpu_product": H100, **labels},
        "annotations": {"value": value}}]}
    return parse_webhook(json.dumps(body).encode()).signals


async def test_an_alert_name_the_resource_does_not_allow_is_ignored_and_counted() -> None:
    kube, _view, actions, _clock = await rolled_out(
        [H100], {"rollback": {"alertNames": ["MTPErrorPropagationHigh"], "cooldownSeconds": 0}})
    outcome = await actions.apply_signals(labelled_alert("MTPHitRateLow"))
    assert (outcome.rolled_back, outcome.unchanged, outcome.unknown) == (0, 0, [])
    assert outcome.ignored == {"not_allowed_by_resource": 1}
    assert kube.calls == [] and kube.events == []
    # nor may a resolved one delay the pool's known-good promotion
    resolved = replace(labelled_alert("MTPHitRateLow")[0], status="resolved")
    assert (await actions.apply_signals([resolved])).ignored == {"not_allowed_by_resource": 1}
    assert kube.calls == []
    # the name it allows acts
    outcome = await actions.apply_signals(labelled_alert("MTPErrorPropagationHigh"))
    assert (outcome.rolled_back, outcome.ignored) == (1, {})
    assert {p: k_of(d) for p, d in kube.deployments().items()} == {H100: 5}


async def test_alert_names_apply_to_the_evaluator_and_matchers_do_not() -> None:
    """alertNames names the rules, which the built-in evaluator runs too: a rule left out
    rolls nothing back from either source. alertMatchers match the labels of a webhook alert;
    the evaluator's signals have none (and come from the operator itself, not a token)."""
    spec = {"rollback": {"alertNames": ["MTPErrorPropagationHigh"], "cooldownSeconds": 0,
                         "alertMatchers": {"cluster": "prod"}}}
    _kube, _view, actions, _clock = await rolled_out([H100], spec)
    evaluator = AlertSignal("MTPHitRateLow", "firing", PoolRef("ml", "res", H100), 0.6, 0.88,
                            "evaluator")
    outcome = await actions.apply_signals([evaluator])
    assert (outcome.rolled_back, outcome.ignored) == (0, {"not_allowed_by_resource": 1})
    evaluator = replace(evaluator, alert="MTPErrorPropagationHigh", value=0.9, threshold=0.4)
    outcome = await actions.apply_signals([evaluator])
    assert (outcome.rolled_back, outcome.ignored) == (1, {})


async def test_alert_matchers_must_all_match_the_webhook_alerts_labels() -> None:
    spec = {"rollback": {"cooldownSeconds": 0,
                         "alertMatchers": {"cluster": "prod", "shard": ""}}}
    kube, _view, actions, _clock = await rolled_out([H100], spec)
    refused = [
        labelled_alert("MTPHitRateLow"),  # no cluster label
        labelled_alert("MTPHitRateLow", cluster="staging"),
        labelled_alert("MTPHitRateLow", cluster="prod", shard="a"),  # "" matches absence only
    ]
    for signals in refused:
        outcome = await actions.apply_signals(signals)
        assert (outcome.rolled_back, outcome.ignored) == (0, {"not_allowed_by_resource": 1})
    assert kube.calls == []
    outcome = await actions.apply_signals(labelled_alert("MTPHitRateLow", cluster="prod"))
    assert (outcome.rolled_back, outcome.ignored) == (1, {})
    assert {p: k_of(d) for p, d in kube.deployments().items()} == {H100: 5}


async def test_an_alert_is_decided_and_folded_once_in_one_pass(serving, monkeypatch) -> None:
    """An alert's decision is folded into the status once, where it is made: the pass that
    persists it plans with that status (reconcile_plan.Fold) instead of folding it again."""
    from mtp_operator import reconcile_plan
    from mtp_operator.control import rollback as control_rollback

    kube, _view, actions, _clock = serving
    folds: list[str] = []
    for module in (control_rollback, reconcile_plan):
        real = module.with_decisions

        def counted(status, decisions, _real=real, _where=module.__name__):
            folds.append(_where)
            return _real(status, decisions)

        monkeypatch.setattr(module, "with_decisions", counted)
    passes: list[Any] = []
    real_pass = actions.reconciler._pass

    async def counted_pass(key, *a, **kw):
        passes.append(key)
        return await real_pass(key, *a, **kw)

    monkeypatch.setattr(actions.reconciler, "_pass", counted_pass)
    outcome = await actions.apply_signals([low_hit_rate()])
    assert outcome.rolled_back == 1
    assert folds == ["mtp_operator.control.rollback"]
    assert passes == [KEY]
    assert {p: k_of(d) for p, d in kube.deployments().items()} == {H100: 5, L40S: 2}
