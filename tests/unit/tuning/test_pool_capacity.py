"""KV capacity at the running K: the gauges read from vLLM's exposition, the window's view,
the tuner's use of it (no deeper trial at capacity) and its status entry."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from mtp_operator.tuning.capacity import Capacity, window_capacity
from mtp_operator.tuning.counters import PodSample, pod_sample
from mtp_operator.tuning.decision import Guard, Policy, decide_tuning
from mtp_operator.tuning.estimator import measure
from mtp_operator.tuning.state import published
from mtp_runtime.spec_decode import SpecCounters
from support.tuning_sim import SimPool, linear_cost

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def exposition(running: float, waiting: float, capacity: float, deferred: float,
               usage: float) -> str:
    return "\n".join([
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}',
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}',
        f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="m",reason="capacity"}} '
        f"{capacity}",
        f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="m",reason="deferred"}} '
        f"{deferred}",
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}',
        'vllm:generation_tokens_total{engine="0",model_name="m"} 10.0',
    ]) + "\n"


def test_pod_sample_reads_the_gauges() -> None:
    s = pod_sample(1.0, exposition(52, 12, 9, 3, 0.97))
    assert (s.running, s.waiting, s.waiting_for_capacity, s.kv_usage) == (52, 12, 9, 0.97)


def test_real_exposition_has_the_gauges() -> None:
    """A real vLLM exposition (0.26 on an H200, committed fixture) carries every gauge read."""
    s = pod_sample(1.0, (FIXTURES / "h200-vllm" / "k1-scrape0-warmup.prom").read_text())
    assert s.running == 0 and s.waiting == 0 and s.waiting_for_capacity == 0
    assert s.kv_usage is not None and 0 <= s.kv_usage <= 1


def sample(running, usage, waiting=0.0, by_reason=None) -> PodSample:
    return PodSample(0.0, SpecCounters(), 0.0, None, running, waiting, usage, by_reason)


def test_window_capacity_from_the_fullest_scrape() -> None:
    cap = window_capacity(3, {"a": [sample(10, 0.2), sample(40, 0.8)], "b": [sample(30, 0.5)]})
    assert cap is not None
    assert cap.peak_running == 40 and cap.kv_usage == 0.8
    assert cap.capacity == 40 / 0.8 and cap.headroom == 40 / 0.8 - 40
    assert not cap.at_capacity
    # waiting for KV space: from the by-reason series when vLLM has it
    full = window_capacity(3, {"a": [sample(45, 0.99, waiting=12, by_reason=9)]})
    assert full is not None and full.waiting == 9 and full.at_capacity
    # without that series: waiting counts only when the cache is (nearly) full
    assert window_capacity(3, {"a": [sample(45, 0.99, waiting=12)]}).waiting == 12
    assert window_capacity(3, {"a": [sample(5, 0.3, waiting=12)]}).waiting == 0
    # too little in use to extrapolate; no gauges at all
    assert window_capacity(1, {"a": [sample(1, 0.01)]}).capacity is None
    assert window_capacity(1, {"a": [PodSample(0.0, SpecCounters(), 0.0, None, None)]}) is None


# deeper is better on this traffic and cost, so a pool at K=1 would try a deeper K
DEEP = SimPool(prefix=(0.97, 0.94, 0.91, 0.88), cost=linear_cost(0.010, 0.0008, k0=0.0095))
T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def _decide(capacity: Capacity | None):
    p = Policy("Auto", (0, 1, 2, 3, 4), observation_seconds=300.0)
    table = [measure(DEEP.window(4, T0.timestamp() - 900, 300.0, 2)),
             measure(DEEP.window(1, T0.timestamp() - 300, 300.0, 2))]
    return decide_tuning(p, 1, None, [], table, Guard(), T0, 2, capacity=capacity)


def test_at_capacity_no_deeper_trial() -> None:
    free = _decide(None)
    assert free.action == "start_trial" and free.trial_k == 4, free  # K=4 measured best
    full = Capacity(1, 45, 0.99, 45.5, 9)
    d = _decide(full)
    assert d.trial_k is None or d.trial_k < 1, d
    assert "at KV capacity" in d.reason
    # the same figures with nobody waiting: deeper trials allowed again
    roomy = _decide(Capacity(1, 45, 0.5, 90, 0))
    assert roomy.trial_k == free.trial_k


def test_capacity_in_status() -> None:
    d = _decide(None)
    entry = published("Auto", d, [], None, [], None, 1, T0, None, Capacity(3, 40, 0.8, 50, 2))
    cap = entry.capacity
    assert cap is not None
    assert (cap.k, cap.peak_running, cap.kv_cache_usage, cap.estimated_capacity, cap.headroom,
            cap.waiting_for_capacity) == (3, 40, 0.8, 50, 10, 2)
