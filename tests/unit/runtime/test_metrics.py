"""The MTP figures of shared/mtp-metrics.md, computed by mtp_runtime.figures
(over the counters of mtp_runtime.spec_decode, parsed by mtp_runtime.exposition)."""

from __future__ import annotations

import math

import pytest

from mtp_runtime import exposition, figures, spec_decode
from mtp_runtime.spec_decode import SpecCounters

pytestmark = pytest.mark.unit


def test_worked_example_on_vllm_sample(sample_prom: str) -> None:
    s = figures.stats(sample_prom)
    assert list(s) == list(figures.STATS_KEYS)
    assert s["hit_rate"] == pytest.approx(2 / 3)
    assert s["acceptance_rate"] == pytest.approx(0.5)
    assert s["mean_acceptance_length"] == pytest.approx(3.0)
    assert s["avg_k_used"] == pytest.approx(2.0)
    assert s["error_propagation_rate"] == pytest.approx(1 / 3)
    assert s["num_speculative_tokens"] == 4
    assert isinstance(s["num_speculative_tokens"], int)


def test_counters_of_the_sample(sample_prom: str) -> None:
    snap = spec_decode.spec_snapshot(sample_prom)
    assert list(snap) == [(("engine", "0"), ("model_name", "dsv3-tiny"))]
    assert spec_decode.total(snap) == SpecCounters(3.0, 12.0, 6.0, (2.0, 2.0, 1.0, 1.0))
    f = figures.figures(sample_prom)
    assert f["position_acceptance_rate"] == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert spec_decode.spec_snapshot(sample_prom, match={"model_name": "other"}) == {}


def test_prefix_counts_match_vllm_sample(sample_prom: str) -> None:
    # the sample is three drafts of K=4 with 4, 2, 0 accepted
    assert figures.accepted_prefix_counts([4, 2, 0], 4) == spec_decode.total(
        spec_decode.spec_snapshot(sample_prom)
    )


def test_no_drafts_gives_no_data_not_zero() -> None:
    c = SpecCounters(10, 40, 20, (8, 6, 4, 2))
    f = figures.figures(c, c)  # nothing happened in between
    for key in figures.STATS_KEYS:
        assert f[key] is None, key
    assert f["position_acceptance_rate"] == []
    assert figures.figures(SpecCounters())["hit_rate"] is None
    assert figures.stats("")["hit_rate"] is None  # speculation off: no spec-decode families at all


def test_increase_between_snapshots() -> None:
    then = SpecCounters(3, 12, 6, (2, 2, 1, 1))
    now = then + figures.accepted_prefix_counts([4, 4, 4, 0], 4)
    f = figures.figures(now, then)
    assert f["drafts"] == 4
    assert f["hit_rate"] == pytest.approx(3 / 4)
    assert f["avg_k_used"] == pytest.approx(3.0)
    # the 0-accepted draft wastes 3; full drafts waste nothing → 3/16
    assert f["error_propagation_rate"] == pytest.approx(3 / 16)


def test_counter_reset_counts_from_zero() -> None:
    key = (("engine", "0"), ("model_name", "x"))
    before = {key: SpecCounters(100, 400, 300, (90, 80, 70, 60))}
    after_restart = {key: figures.accepted_prefix_counts([4, 0], 4)}
    inc = spec_decode.increase(after_restart, before)
    assert inc == figures.accepted_prefix_counts([4, 0], 4)
    assert figures.figures(after_restart, before)["hit_rate"] == pytest.approx(0.5)


def test_reset_with_new_k_and_new_series() -> None:
    key = (("engine", "0"), ("model_name", "x"))
    before = {key: SpecCounters(10, 40, 20, (8, 6, 4, 2))}
    after = {key: figures.accepted_prefix_counts([2, 1], 2)}  # restarted with K=2
    f = figures.figures(after, before)
    assert f["num_speculative_tokens"] == 2
    assert f["hit_rate"] == 1.0
    # a second engine appearing later counts from zero
    other = (("engine", "1"), ("model_name", "x"))
    both = {key: before[key] + figures.accepted_prefix_counts([4], 4), other: SpecCounters(1, 4, 0,
                                                                                   (0, 0, 0, 0))}
    f = figures.figures(both, before)
    assert f["drafts"] == 2
    assert f["hit_rate"] == 0.5


def test_k1_error_propagation_is_zero() -> None:
    c = figures.accepted_prefix_counts([1, 0, 1, 1, 0], 1)
    f = figures.figures(c)
    assert f["num_speculative_tokens"] == 1
    assert f["error_propagation_rate"] == 0.0
    assert f["hit_rate"] == pytest.approx(0.6)
    assert f["acceptance_rate"] == pytest.approx(0.6)


def test_error_propagation_zero_when_all_or_nothing() -> None:
    f = figures.figures(figures.accepted_prefix_counts([4, 4, 3, 4], 4))
    assert f["error_propagation_rate"] == 0.0  # rejected only at the last position


def test_mixed_k_window_leaves_error_propagation_undefined() -> None:
    c = SpecCounters(2, 5, 2, (1, 1, 0))  # T/D = 2.5: drafts of different K
    f = figures.figures(c)
    assert f["num_speculative_tokens"] == 2.5
    assert f["error_propagation_rate"] is None
    assert f["acceptance_rate"] == pytest.approx(0.4)


def test_matches_expectation_under_independent_acceptance() -> None:
    import random

    rng = random.Random(1)
    for k, p in ((2, 0.8), (4, 0.8), (6, 0.8)):
        draws = []
        for _ in range(40000):
            n = 0
            while n < k and rng.random() < p:
                n += 1
            draws.append(n)
        f = figures.figures(figures.accepted_prefix_counts(draws, k))
        assert f["error_propagation_rate"] == pytest.approx(
            figures.expected_error_propagation(p, k), abs=0.01)
    assert figures.expected_error_propagation(0.8, 2) == pytest.approx(0.10)
    assert figures.expected_error_propagation(0.8, 4) == pytest.approx(0.262)  # doc: ≈ 0.26


def test_window_sums_consecutive_increases_across_a_reset() -> None:
    key = (("engine", "0"),)
    w = figures.CounterWindow(span_s=300)
    assert w.increase() is None
    w.add(0, {key: figures.accepted_prefix_counts([4] * 10, 4)})
    w.add(15, {key: figures.accepted_prefix_counts([4] * 10 + [0] * 10, 4)})
    w.add(30, {key: figures.accepted_prefix_counts([2] * 5, 4)})  # restart, then 5 drafts
    inc = w.increase()
    assert inc is not None and inc.drafts == 15
    assert w.figures()["hit_rate"] == pytest.approx(5 / 15)
    # after the window passes, the old samples age out: only the last pair remains
    w.add(400, {key: figures.accepted_prefix_counts([2] * 5, 4)})
    assert len(w) == 2
    assert w.figures(400)["hit_rate"] is None  # nothing happened between t=30 and t=400


def test_window_prune_keeps_a_baseline() -> None:
    key = (("engine", "0"),)
    w = figures.CounterWindow(span_s=60)
    for t in range(0, 301, 15):
        w.add(t, {key: figures.accepted_prefix_counts([3] * t, 4)})
    inc = w.increase(300)
    assert inc is not None and inc.drafts == 60  # exactly the last 60 s


def test_parser_escapes_special_values_and_timestamps() -> None:
    text = (
        '# HELP x A "help" line\n# TYPE x counter\n'
        'x{a="q\\"uote",b="back\\\\slash",c="new\\nline"} 1.5 1700000000000\n'
        "y +Inf\nz NaN\nw{} -2e-3\n# EOF\n"
    )
    e = exposition.parse_exposition(text)
    assert e.types == {"x": "counter"}
    assert e.samples[0].labels == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline"}
    assert e.samples[0].value == 1.5
    assert e.samples[1].value == math.inf
    assert math.isnan(e.samples[2].value)
    assert e.samples[3].value == -0.002
    with pytest.raises(exposition.ParseError):
        exposition.parse_exposition('x{a="1" 2\n')
