"""Built-in evaluator: figures over a window of scrapes, forSeconds, no data; frozen clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mtp_operator.api.v1alpha1 import RollbackSpec
from mtp_operator.rollback.evaluation import PoolEvaluator, pool_snapshot
from mtp_operator.rollback.policy import PoolRollbackState, decide_rollback
from mtp_operator.rollback.signals import ERROR_PROPAGATION_HIGH, HIT_RATE_LOW, PoolRef
from mtp_runtime.figures import accepted_prefix_counts
from mtp_runtime.spec_decode import SpecCounters

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
POOL = PoolRef("ml", "dsv3", "NVIDIA-H100-80GB-HBM3")
SPEC = RollbackSpec()  # window 300 s, for 300 s, min 50 drafts, thresholds 0.88 / 0.40
SCRAPE = 30  # seconds between scrapes


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def drafts(k: int, hit: float, n: int = 100) -> SpecCounters:
    """n drafts of K tokens: a share `hit` fully accepted, the rest rejected at position 0."""
    full = round(n * hit)
    return accepted_prefix_counts([k] * full + [0] * (n - full), k)


class Pod:
    """A vLLM pod's cumulative counters (engine 0)."""

    def __init__(self) -> None:
        self.total = SpecCounters()

    def serve(self, counters: SpecCounters) -> None:
        self.total = self.total + counters

    def snapshot(self) -> dict:
        return {(("engine", "0"),): self.total}


def run(ev: PoolEvaluator, pod: Pod, start: int, end: int, traffic, spec=SPEC, k=None):
    """Scrape every SCRAPE seconds in [start, end); returns [(t, evaluation)]."""
    out = []
    for t in range(start, end, SCRAPE):
        if traffic is not None:
            pod.serve(traffic)
        out.append((t, ev.observe(at(t), pool_snapshot({"p0": pod.snapshot()}), spec, k=k)))
    return out


def fired(results, status="firing"):
    return [(t, s.alert) for t, e in results for s in e.signals if s.status == status]


def test_low_hit_rate_fires_after_for_seconds_and_repeats() -> None:
    ev, pod = PoolEvaluator(POOL), Pod()
    results = run(ev, pod, 0, 600, drafts(2, 0.7))
    # t=0: one scrape, no window yet → no data; pending from t=30; fires at 30+300
    assert results[0][1].no_data and not results[1][1].no_data
    assert fired(results) == [(330, HIT_RATE_LOW), (390, HIT_RATE_LOW), (450, HIT_RATE_LOW),
                              (510, HIT_RATE_LOW), (570, HIT_RATE_LOW)]  # fmt: skip
    signal = results[11][1].signals[0]
    assert signal.value == pytest.approx(0.7)
    assert (signal.threshold, signal.via, signal.target) == (0.88, "evaluator", POOL)
    assert signal.starts_at == at(30)
    assert results[11][1].figures["hit_rate"] == pytest.approx(0.7)


def test_healthy_pool_never_fires() -> None:
    ev, pod = PoolEvaluator(POOL), Pod()
    assert fired(run(ev, pod, 0, 1200, drafts(4, 0.95))) == []


@pytest.mark.parametrize("traffic", [None, drafts(2, 0.5, n=4)], ids=["idle", "trickle"])
def test_no_data_never_fires(traffic) -> None:
    ev, pod = PoolEvaluator(POOL), Pod()
    pod.serve(drafts(2, 0.5, n=1000))  # old history before the evaluator started
    results = run(ev, pod, 0, 1200, traffic)
    assert all(e.no_data for _, e in results) and fired(results) == []


def test_recovery_resolves_once() -> None:
    ev, pod = PoolEvaluator(POOL), Pod()
    bad = run(ev, pod, 0, 360, drafts(2, 0.7))
    assert fired(bad) == [(330, HIT_RATE_LOW)]
    good = run(ev, pod, 360, 1200, drafts(2, 0.99, n=1000))
    assert len(fired(good, "resolved")) == 1 and fired(good) == []
    (resolved,) = [s for _, e in good for s in e.signals]
    assert resolved.status == "resolved" and resolved.value is not None


def test_going_idle_resolves_with_no_value() -> None:
    ev, pod = PoolEvaluator(POOL), Pod()
    run(ev, pod, 0, 360, drafts(2, 0.7))
    idle = run(ev, pod, 360, 1000, None)
    # the window still holds the bad minutes for a while (repeats), then too few drafts
    (resolved,) = [s for _, e in idle for s in e.signals if s.status == "resolved"]
    assert resolved.value is None and resolved.ends_at is not None
    assert fired(idle, "resolved") == [(630, HIT_RATE_LOW)]


def test_crossing_must_be_continuous() -> None:
    ev, pod = PoolEvaluator(POOL), Pod()
    spec = RollbackSpec(window_seconds=60, for_seconds=120)
    r1 = run(ev, pod, 0, 120, drafts(2, 0.7), spec)  # pending from 30, not yet 120 s
    r2 = run(ev, pod, 120, 240, drafts(2, 0.99), spec)  # healthy again: pending cleared
    r3 = run(ev, pod, 240, 420, drafts(2, 0.7), spec)
    assert fired(r1) == [] and fired(r2) == []
    # the second episode's window is fully bad from 300 (window 60 s), pending from the first
    # crossing scrape; fires 120 s later
    first_bad = next(t for t, e in r3 if e.figures["hit_rate"] < 0.88)
    assert fired(r3) == [(first_bad + 120, HIT_RATE_LOW)]


def test_deep_chain_fires_error_propagation_only() -> None:
    ev, pod = PoolEvaluator(POOL), Pod()
    # K=6, hit rate 0.9, but mostly rejected early in the chain: error propagation 0.45
    traffic = accepted_prefix_counts([1] * 80 + [6] * 10 + [0] * 10, 6)
    results = run(ev, pod, 0, 400, traffic)
    assert {a for _, a in fired(results)} == {ERROR_PROPAGATION_HIGH}
    signal = next(s for _, e in results for s in e.signals)
    # (D(K-1) - A + c_5) / T = (100*5 - 140 + 10) / 600
    assert signal.value == pytest.approx(370 / 600) and signal.threshold == 0.4


def test_worked_example_figures() -> None:
    ev, pod = PoolEvaluator(POOL), Pod()
    example = accepted_prefix_counts([4, 2, 0], 4)
    spec = RollbackSpec(min_drafts=1)
    ((_, first), (_, second)) = run(ev, pod, 0, 60, example, spec)
    assert first.no_data  # one scrape is no window
    f = second.figures
    assert (f["drafts"], f["draft_tokens"], f["accepted_tokens"]) == (3, 12, 6)
    assert f["hit_rate"] == pytest.approx(2 / 3) and f["acceptance_rate"] == 0.5
    assert f["mean_acceptance_length"] == 3.0 and f["avg_k_used"] == 2.0
    assert f["error_propagation_rate"] == pytest.approx(4 / 12)


def test_a_change_of_k_starts_over() -> None:
    ev, pod = PoolEvaluator(POOL), Pod()
    r1 = run(ev, pod, 0, 330, drafts(2, 0.7), k=2)
    assert fired(r1) == []  # pending since 30, would fire at 330
    r2 = run(ev, pod, 330, 630, drafts(1, 0.7), k=1)
    # K changed at 330: no window at 330 (one scrape), pending again from 360 → fires at 660
    assert r2[0][1].no_data and fired(r2) == []
    r3 = run(ev, pod, 630, 700, drafts(1, 0.7), k=1)
    assert fired(r3) == [(660, HIT_RATE_LOW)]


def test_a_missed_scrape_does_not_count_the_pod_from_zero() -> None:
    ev = PoolEvaluator(POOL)
    a, b = Pod(), Pod()
    a.serve(drafts(2, 0.95, n=100_000))  # long healthy history
    b.serve(drafts(2, 0.95, n=100_000))
    spec = RollbackSpec(min_drafts=1)
    for t in range(0, 300, SCRAPE):
        a.serve(drafts(2, 0.95))
        b.serve(drafts(2, 0.95))
        pods = {"a": a.snapshot()} if t == 120 else {"a": a.snapshot(), "b": b.snapshot()}
        e = ev.observe(at(t), pool_snapshot(pods), spec)
    # 9 intervals x 2 pods x 100 drafts, not 100,000 more for b's return after the gap
    assert e.figures["drafts"] == 9 * 2 * 100
    assert e.figures["hit_rate"] == pytest.approx(0.95)


def test_counter_reset_of_a_restarted_pod() -> None:
    ev, pod = PoolEvaluator(POOL), Pod()
    spec = RollbackSpec(min_drafts=1)
    run(ev, pod, 0, 90, drafts(2, 0.95), spec)
    pod.total = SpecCounters()  # vLLM restarted
    results = run(ev, pod, 90, 180, drafts(2, 0.95), spec)
    assert results[-1][1].figures["hit_rate"] == pytest.approx(0.95)
    assert fired(results) == []


def test_evaluator_signal_drives_the_policy() -> None:
    ev, pod = PoolEvaluator(POOL), Pod()
    state = PoolRollbackState(POOL.gpu_product, current_k=6, spec_k=6, settings_since=T0)
    changes = []
    for t, e in run(ev, pod, 0, 1200, drafts(6, 0.7), k=6):
        for s in e.signals:
            d = decide_rollback(state, s, SPEC, at(t))
            state = d.state
            if d.changed:
                changes.append((t, d.new_k, d.record.via))
    # fired at 330 → 5; K passed to observe stays 6 here, the repeats every 60 s wait out
    # the cooldown (600 s by default) and step once more at 930
    assert SPEC.cooldown_seconds == 600
    assert changes == [(330, 5, "evaluator"), (930, 4, "evaluator")]
