"""What a pool's pods say over one window: vLLM's counters, read and differenced. Pure.

The tuner needs more than the four spec-decode counters the rollback alerts use (those come
from `mtp_runtime.spec_decode`): how many tokens the engine emitted, how many engine steps it ran
(where vLLM exposes that) and how many requests it was running. Names as vLLM 0.33 writes
them (shared/vllm-0.33.0/metrics-sample.prom):

- `vllm:generation_tokens_total` (counter): output tokens emitted, G
- `vllm:iteration_tokens_total_count` (the count of the histogram "tokens per engine_step"):
  engine steps, S; absent from older or trimmed expositions, then None
- `vllm:num_requests_running` (gauge): requests in the running batch, sampled at each scrape
- `vllm:e2e_request_latency_seconds_sum` and `vllm:request_generation_tokens_sum` (histogram
  sums): the seconds each finished request spent in the engine, arrival to last token, and
  the tokens it got, summed over finished requests. Over a window their increases give the
  finished requests' output tokens per second of their own time exactly (no sampling): what a
  pool below saturation differs in by K (`estimator.same_offered_load`)

No I/O and no clock: callers pass the exposition text and the times of their scrapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mtp_runtime.exposition import Exposition, parse_exposition
from mtp_runtime.spec_decode import SpecCounters, spec_snapshot, total

GENERATION_TOKENS = "vllm:generation_tokens_total"
ENGINE_STEPS = "vllm:iteration_tokens_total_count"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
KV_USAGE = "vllm:kv_cache_usage_perc"
REQUEST_SECONDS = "vllm:e2e_request_latency_seconds_sum"
REQUEST_TOKENS = "vllm:request_generation_tokens_sum"


@dataclass(frozen=True)
class PodSample:
    """One scrape of one pod (sums over the engine series in it)."""

    t: float  # when it was taken (seconds, any epoch; callers use one clock)
    spec: SpecCounters
    generation_tokens: float
    engine_steps: float | None
    running: float | None
    waiting: float | None = None
    kv_usage: float | None = None  # vllm:kv_cache_usage_perc, 0..1
    waiting_for_capacity: float | None = None  # waiting_by_reason{reason="capacity"}
    request_seconds: float | None = None  # e2e latency histogram's sum (finished requests)
    request_tokens: float | None = None  # generation tokens histogram's sum (finished)


def _sum(exp: Exposition, name: str, **labels: str) -> float | None:
    found = [s for s in exp.family(name)
             if all(s.labels.get(a) == b for a, b in labels.items())]
    return sum(s.value for s in found) if found else None


def _max(exp: Exposition, name: str) -> float | None:
    found = exp.family(name)
    return max(s.value for s in found) if found else None


def pod_sample(t: float, source: str | Exposition) -> PodSample:
    """Read one pod's exposition. A pod without speculation has zero spec counters."""
    exp = parse_exposition(source) if isinstance(source, str) else source
    return PodSample(
        t=t,
        spec=total(spec_snapshot(exp)),
        generation_tokens=_sum(exp, GENERATION_TOKENS) or 0.0,
        engine_steps=_sum(exp, ENGINE_STEPS),
        running=_sum(exp, RUNNING),
        waiting=_sum(exp, WAITING),
        kv_usage=_max(exp, KV_USAGE),
        waiting_for_capacity=_sum(exp, WAITING_BY_REASON, reason="capacity"),
        request_seconds=_sum(exp, REQUEST_SECONDS),
        request_tokens=_sum(exp, REQUEST_TOKENS),
    )


def pod_k(sample: PodSample) -> int:
    """The K a pod runs, from its exposition: vLLM exports one accepted-per-position series
    per draft position from start-up, and no spec-decode series at all without speculation
    (falls back to draft tokens per draft when the positions are missing)."""
    if sample.spec.per_position:
        return len(sample.spec.per_position)
    if sample.spec.drafts > 0:
        return round(sample.spec.draft_tokens / sample.spec.drafts)
    return 0


@dataclass(frozen=True)
class WindowCounters:
    """Increases over one window of the replicas of a pool that ran one K throughout it."""

    k: int
    start: float
    end: float
    replicas: int  # pods counted (each was up and at this K for the whole window)
    spec: SpecCounters  # drafts, draft tokens, accepted, accepted per position
    generation_tokens: float
    engine_steps: float | None  # None when any counted pod does not expose it
    running_mean: float | None  # mean requests running per replica over the window's scrapes
    # seconds in the engine of the requests that finished in the window, and the tokens they
    # got (every counted pod; None when any of them does not expose the histograms)
    request_seconds: float | None = None
    request_tokens: float | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _grew(first: PodSample, last: PodSample) -> bool:
    """False when a counter went down: the engine restarted inside the window."""
    a, b = first.spec.values(), last.spec.values()
    if len(b) < len(a) or any(y < x for x, y in zip(a, b, strict=False)):
        return False
    if last.generation_tokens < first.generation_tokens:
        return False
    return all(b >= a for a, b in ((first.engine_steps, last.engine_steps),
                                   (first.request_seconds, last.request_seconds),
                                   (first.request_tokens, last.request_tokens))
               if a is not None and b is not None)


def _increase(total: float | None, first: float | None, last: float | None) -> float | None:
    """A running sum over pods of one counter's increase; None once any pod lacks it."""
    if total is None or first is None or last is None:
        return None
    return total + last - first


def _diff(last: SpecCounters, first: SpecCounters) -> SpecCounters:
    n = len(last.per_position)
    before = first.per_position + (0.0,) * (n - len(first.per_position))
    return SpecCounters(
        last.drafts - first.drafts,
        last.draft_tokens - first.draft_tokens,
        last.accepted - first.accepted,
        tuple(b - a for a, b in zip(before, last.per_position, strict=True)),
    )


def window_counters(
    k: int, samples: Mapping[str, Iterable[PodSample]], start: float, end: float
) -> WindowCounters | None:
    """The increases over [start, end] of the pods in `samples` (scrapes per pod, any order).

    Per pod, its earliest scrape in the window stands for the start and must lie within 5 %
    of the window's length of `start`, its latest likewise for `end`. A pod whose counters
    went down (a restart) or that was not scraped across the whole window is left out. None
    when no pod counts.
    """
    span = end - start
    if span <= 0:
        raise ValueError("window end must be after its start")
    slack = 0.05 * span
    spec = SpecCounters()
    gen = 0.0
    steps: float | None = 0.0
    req_seconds: float | None = 0.0
    req_tokens: float | None = 0.0
    running: list[float] = []
    replicas = 0
    for pod_samples in samples.values():
        inside = sorted(
            (s for s in pod_samples if start - slack <= s.t <= end + slack), key=lambda s: s.t
        )
        if len(inside) < 2:
            continue
        first, last = inside[0], inside[-1]
        if first.t > start + slack or last.t < end - slack or not _grew(first, last):
            continue
        replicas += 1
        spec = spec + _diff(last.spec, first.spec)
        gen += last.generation_tokens - first.generation_tokens
        steps = _increase(steps, first.engine_steps, last.engine_steps)
        req_seconds = _increase(req_seconds, first.request_seconds, last.request_seconds)
        req_tokens = _increase(req_tokens, first.request_tokens, last.request_tokens)
        running += [s.running for s in inside if s.running is not None]
    if replicas == 0:
        return None
    # running samples are per pod; their mean is already per replica
    mean_running = sum(running) / len(running) if running else None
    return WindowCounters(k, start, end, replicas, spec, gen, steps, mean_running,
                          req_seconds, req_tokens)
