"""How close a pool runs to what its KV cache holds at its K. Pure.

On hybrid models (gated-DeltaNet / Mamba layers beside attention, e.g. Qwen3.5/3.6 and
Qwen3-Next) every request keeps 1 + K copies of its recurrent state, so K lowers the number of
requests that fit: measured at real size on an H100 (bench/results/gpu/realsize.md), a 27B-class
hybrid held 132 requests of 1,024 tokens at K=0 and 45 at K=3. Requests past that wait for a
whole wave of others to finish, which costs far more than drafting gains. Dense models lose
little (their draft state is a few KV blocks).

From the scrapes of one window (vLLM's gauges, per pod):
- peak running    the most requests one replica ran at once (`vllm:num_requests_running`)
- KV usage        `vllm:kv_cache_usage_perc` at that scrape (0..1)
- capacity        running / KV usage at the fullest scrape: the requests of the window's mix
                  (lengths as they were) the cache holds at this K; None when under
                  MIN_USAGE_FOR_ESTIMATE is in use (too little to extrapolate from)
- waiting         the most requests waiting for KV space (`vllm:num_requests_waiting_by_reason
                  {reason="capacity"}`; without that series, `vllm:num_requests_waiting` at a
                  scrape with KV usage >= FULL_USAGE)
- at capacity     waiting > 0: the pool's concurrency ran into what K leaves room for
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .counters import PodSample

MIN_USAGE_FOR_ESTIMATE = 0.1
FULL_USAGE = 0.95


@dataclass(frozen=True)
class Capacity:
    k: int
    peak_running: float
    kv_usage: float | None  # at the fullest scrape
    capacity: float | None  # requests of the window's mix that fit at this K, per replica
    waiting: float  # most requests waiting for KV space at one scrape

    @property
    def at_capacity(self) -> bool:
        return self.waiting > 0

    @property
    def headroom(self) -> float | None:
        return None if self.capacity is None else self.capacity - self.peak_running

    def describe(self) -> str:
        parts = [f"K={self.k}: at most {self.peak_running:g} requests running a replica"]
        if self.kv_usage is not None:
            parts.append(f"KV cache {100 * self.kv_usage:.0f} % used")
        if self.capacity is not None:
            parts.append(f"room for ~{self.capacity:.0f} of this mix")
        if self.waiting:
            parts.append(f"{self.waiting:g} waiting for KV space")
        return ", ".join(parts)


def _waiting(s: PodSample) -> float:
    if s.waiting_for_capacity is not None:
        return s.waiting_for_capacity
    if s.waiting and s.kv_usage is not None and s.kv_usage >= FULL_USAGE:
        return s.waiting
    return 0.0


def window_capacity(k: int, by_pod: Mapping[str, Sequence[PodSample]]) -> Capacity | None:
    """The capacity view of one window's scrapes of the replicas at K; None without gauges."""
    scrapes = [s for samples in by_pod.values() for s in samples if s.running is not None]
    if not scrapes:
        return None
    peak = max(s.running or 0.0 for s in scrapes)
    with_usage = [s for s in scrapes if s.kv_usage is not None]
    fullest = max(with_usage, key=lambda s: s.kv_usage or 0.0) if with_usage else None
    usage = fullest.kv_usage if fullest is not None else None
    cap = None
    if fullest is not None and usage is not None and usage >= MIN_USAGE_FOR_ESTIMATE \
            and fullest.running:
        cap = fullest.running / usage
    return Capacity(k, peak, usage, cap, max(_waiting(s) for s in scrapes))
