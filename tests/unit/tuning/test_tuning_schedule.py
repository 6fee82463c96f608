"""Batch-size schedule from measurements at several concurrencies (simulated pools)."""

from __future__ import annotations

from mtp_operator.tuning.estimator import measure
from mtp_operator.tuning.schedule import OPEN_END, best_by_band, recommend_schedule
from support.tuning_sim import SimPool, linear_cost

PREFIX = (0.9, 0.8, 0.7, 0.6)
# at one request the target step is cheap to verify more tokens on (memory-bound): deep K;
# at eight requests the verification costs more per token: shallow K
ALONE = SimPool(PREFIX, linear_cost(0.010, 0.0005, k0=0.0098), concurrency=1.0)
BUSY = SimPool(PREFIX, linear_cost(0.010, 0.010, k0=0.009), concurrency=8.0)


def windows(sim, ks):
    return [measure(sim.window(k, 100.0 * i, 60.0)) for i, k in enumerate(ks)]


def test_best_k_per_band_from_first_principles():
    table = windows(ALONE, [1, 2, 4]) + windows(BUSY, [1, 2, 4])
    best = best_by_band(table)
    assert best == {1: max((1, 2, 4), key=ALONE.true_tps), 8: max((1, 2, 4), key=BUSY.true_tps)}
    assert best == {1: 4, 8: 1}


def test_schedule_splits_between_bands():
    table = windows(ALONE, [1, 2, 4]) + windows(BUSY, [1, 2, 4])
    # bands 1 and 8: split at (1 + 8) // 2 = 4
    assert recommend_schedule(table) == [(1, 4, 4), (5, OPEN_END, 1)]


def test_no_schedule_when_one_k_wins_everywhere_or_a_band_has_one_k():
    same = SimPool(PREFIX, linear_cost(0.010, 0.0005), concurrency=8.0)
    assert recommend_schedule(windows(ALONE, [1, 4]) + windows(same, [1, 4])) is None
    assert recommend_schedule(windows(ALONE, [1, 4]) + windows(BUSY, [4])) is None


def test_published_in_status():
    from datetime import UTC, datetime

    from mtp_operator.tuning.decision import TuningDecision
    from mtp_operator.tuning.state import published

    table = windows(ALONE, [1, 2, 4]) + windows(BUSY, [1, 2, 4])
    d = TuningDecision("hold", 4, None, None, 4, "why")
    entry = published("Recommend", d, table, None, [], None, 1,
                      datetime(2026, 12, 1, tzinfo=UTC), recommend_schedule(table))
    assert [(r.min_batch_size, r.max_batch_size, r.num_speculative_tokens)
            for r in entry.recommended_schedule] == [(1, 4, 4), (5, OPEN_END, 1)]
