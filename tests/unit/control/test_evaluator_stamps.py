"""Evaluator rounds are stamped by their cadence, not by when they woke (control/evaluator.py
RoundStamps): a window of a whole number of intervals then always starts on an earlier
round's sample. Expected figures are counts of the sample times and drafts put in."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from mtp_operator.control.evaluator import MAX_STAMP_DRIFT, RoundStamps
from mtp_runtime.figures import CounterWindow
from mtp_runtime.spec_decode import SpecCounters

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
INTERVAL = 15.0
DRAFTS_PER_ROUND = 100  # each round's sample holds 100 more drafts than the one before


def woke(rng: random.Random, n: int) -> datetime:
    """The wall time round n woke at: its due time plus a scheduler delay of 0-20 ms."""
    return T0 + timedelta(seconds=n * INTERVAL + rng.uniform(0.0, 0.02))


def test_stamps_are_whole_intervals_apart_whatever_the_wake_up_delay() -> None:
    rng = random.Random(3)
    stamps = RoundStamps(INTERVAL)
    got = [stamps.next(woke(rng, n)) for n in range(40)]
    first = got[0]
    assert first == woke(random.Random(3), 0)  # the first round's own wall time
    assert got == [first + timedelta(seconds=INTERVAL) * n for n in range(40)]


def window_drafts(times: list[datetime], window: float) -> list[float]:
    w = CounterWindow(window)
    out = []
    for n, t in enumerate(times):
        w.add(t.timestamp(), {("pod",): SpecCounters(drafts=float(n * DRAFTS_PER_ROUND))})
        inc = w.increase(t.timestamp())
        out.append(inc.drafts if inc is not None else 0.0)
    return out


def test_a_two_interval_window_holds_two_rounds_of_drafts_every_round() -> None:
    """Stamped on waking, some windows reach back one interval further (the sample at
    now - window came a few ms later than now - window): three rounds' drafts, not two."""
    window = 2 * INTERVAL
    rng = random.Random(7)
    woken = [woke(rng, n) for n in range(60)]
    on_waking = window_drafts(woken, window)[2:]
    stamps = RoundStamps(INTERVAL)
    on_cadence = window_drafts([stamps.next(t) for t in woken], window)[2:]
    assert set(on_cadence) == {2 * DRAFTS_PER_ROUND}
    # the fault being fixed: with these delays a fair share of windows are an interval long
    assert on_waking.count(3 * DRAFTS_PER_ROUND) >= 10, on_waking
    assert set(on_waking) <= {2 * DRAFTS_PER_ROUND, 3 * DRAFTS_PER_ROUND}


def test_a_clock_step_or_an_overrun_round_starts_the_cadence_again() -> None:
    stamps = RoundStamps(INTERVAL)
    assert stamps.next(T0) == T0
    assert stamps.next(T0 + timedelta(seconds=INTERVAL, milliseconds=5)) == \
        T0 + timedelta(seconds=INTERVAL)
    stepped = T0 + timedelta(seconds=2 * INTERVAL) + MAX_STAMP_DRIFT + timedelta(milliseconds=1)
    assert stamps.next(stepped) == stepped  # the wall clock moved: stamps follow it
    assert stamps.next(stepped + timedelta(seconds=INTERVAL, milliseconds=3)) == \
        stepped + timedelta(seconds=INTERVAL)
    stamps.restart()  # run_evaluator: a round took longer than the interval
    late = stepped + timedelta(seconds=2 * INTERVAL + 4)
    assert stamps.next(late) == late
