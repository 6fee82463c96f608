"""MTP health figures from vLLM's spec-decode counters (`spec_decode`): pure maths.

Pure and shared: the runtime's exporter and the operator's built-in evaluator both compute
their numbers here, so they always agree with each other and with the definitions in
shared/mtp-metrics.md (and the recording rules written from it). No I/O, no clock: callers
pass exposition text and timestamps in.

Figures, from the INCREASES of the counters between two snapshots (or over a window):

- hit_rate               = c_0 / D
- acceptance_rate        = A / T
- mean_acceptance_length = 1 + A / D
- avg_k_used             = A / D
- error_propagation_rate = (D·(K-1) - A + c_{K-1}) / T, with K = T / D
- position_acceptance_rate[j] = c_j / D
- num_speculative_tokens = T / D (K as the counters show it)

K is derived from the counters (draft tokens per draft), not taken from the configuration, so
the figure is right for whatever K the server really ran in the window. If T / D is not a
whole number the window mixes drafts of different K (a restart with another K inside the
window): error_propagation_rate is then undefined (None) and num_speculative_tokens is the
fractional mean. With D = 0 (idle server, no drafts) every figure is None: "no data", never 0.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable

from mtp_runtime.exposition import Exposition
from mtp_runtime.spec_decode import Snapshot, SpecCounters, increase, spec_snapshot, total

# The keys of `figures()` that `mtp-runtime stats` prints, in this order.
STATS_KEYS = (
    "hit_rate",
    "acceptance_rate",
    "mean_acceptance_length",
    "avg_k_used",
    "error_propagation_rate",
    "num_speculative_tokens",
)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _whole(x: float) -> int | None:
    r = round(x)
    return r if abs(x - r) < 1e-9 else None


def figures_from_increase(inc: SpecCounters) -> dict[str, object]:
    """The MTP figures (shared/mtp-metrics.md) from counter increases; None where undefined.

    Keys: hit_rate, acceptance_rate, mean_acceptance_length, avg_k_used,
    error_propagation_rate, num_speculative_tokens, position_acceptance_rate (list, [] when
    undefined), drafts, draft_tokens, accepted_tokens (the increases themselves).
    """
    d, t, a, c = inc.drafts, inc.draft_tokens, inc.accepted, inc.per_position
    out: dict[str, object] = {key: None for key in STATS_KEYS}
    out.update(
        position_acceptance_rate=[], drafts=d, draft_tokens=t, accepted_tokens=a
    )
    if d <= 0:
        return out
    out["acceptance_rate"] = _ratio(a, t)
    out["mean_acceptance_length"] = 1 + a / d
    out["avg_k_used"] = a / d
    out["hit_rate"] = c[0] / d if c else None
    out["position_acceptance_rate"] = [cj / d for cj in c]
    k_mean = t / d
    k = _whole(k_mean)
    out["num_speculative_tokens"] = k if k is not None else k_mean
    if k is not None and k >= 1 and t > 0 and (k == 1 or len(c) >= k):
        c_last = c[k - 1] if k >= 1 and len(c) >= k else 0.0
        waste = d * (k - 1) - a + c_last
        out["error_propagation_rate"] = max(waste, 0.0) / t
    return out


def figures(
    now: Snapshot | SpecCounters | str, then: Snapshot | SpecCounters | str | None = None
) -> dict[str, object]:
    """The MTP figures over the increase from `then` to `now` (or since start if then=None).

    `now`/`then` may be snapshots from spec_snapshot(), SpecCounters, or exposition text.
    """
    if isinstance(now, str):
        now = spec_snapshot(now)
    if isinstance(then, str):
        then = spec_snapshot(then)
    return figures_from_increase(increase(now, then))


def stats(exposition: str | Exposition) -> dict[str, object]:
    """Figures from one exposition, cumulative since the counters started (`mtp-runtime stats`)."""
    all_figures = figures_from_increase(total(spec_snapshot(exposition)))
    return {key: all_figures[key] for key in STATS_KEYS}


# ---------------------------------------------------------------------------------------------
# Sliding window


class CounterWindow:
    """Snapshots taken over time; figures over the last `span_s` seconds.

    The increase over the window is the sum of the increases between consecutive snapshots
    in it, each reset-aware, so a vLLM restart inside the window loses nothing but the
    drafts between the last scrape before and the restart. Pure: callers pass the time.
    """

    def __init__(self, span_s: float = 300.0) -> None:
        if span_s <= 0:
            raise ValueError("window span must be positive")
        self.span_s = span_s
        self._items: deque[tuple[float, Snapshot]] = deque()

    def add(self, t: float, snapshot: Snapshot) -> None:
        self._items.append((t, dict(snapshot)))
        self.prune(t)

    def prune(self, now: float) -> None:
        # keep one snapshot at or before the window start as the baseline
        while len(self._items) >= 2 and self._items[1][0] <= now - self.span_s:
            self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)

    def increase(self, now: float | None = None) -> SpecCounters | None:
        """Increase over the window; None with fewer than two snapshots (no data yet)."""
        if now is not None:
            self.prune(now)
        items = list(self._items)
        if len(items) < 2:
            return None
        result = SpecCounters()
        for (_, older), (_, newer) in itertools.pairwise(items):
            result = result + increase(newer, older)
        return result

    def figures(self, now: float | None = None) -> dict[str, object]:
        inc = self.increase(now)
        return figures_from_increase(inc if inc is not None else SpecCounters())


def expected_error_propagation(p: float, k: int) -> float:
    """Chained waste under independent per-position acceptance p: (1-p)·Σ_j p^j (K-1-j) / K."""
    if k <= 0:
        raise ValueError("k must be positive")
    return (1 - p) * sum(p**j * (k - 1 - j) for j in range(k)) / k


def accepted_prefix_counts(accepted_per_draft: Iterable[int], k: int) -> SpecCounters:
    """The counters vLLM would add for drafts of K tokens with these accepted-prefix lengths."""
    drafts = 0
    per = [0] * k
    accepted = 0
    for n in accepted_per_draft:
        if not 0 <= n <= k:
            raise ValueError(f"accepted tokens per draft must be within 0..{k}, got {n}")
        drafts += 1
        accepted += n
        for j in range(n):
            per[j] += 1
    return SpecCounters(float(drafts), float(drafts * k), float(accepted), tuple(map(float, per)))
