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
from dataclasses import dataclass, field, fields

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


@dataclass(frozen=True)
class Figures:
    """The MTP figures (shared/mtp-metrics.md) over some counter increases; None where
    undefined ("no data"), never 0. `drafts`, `draft_tokens`, `accepted_tokens` are the
    increases themselves. `figures["hit_rate"]` reads a figure by its name (STATS_KEYS)."""

    hit_rate: float | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    avg_k_used: float | None = None
    error_propagation_rate: float | None = None
    num_speculative_tokens: int | float | None = None  # an int unless K changed in the window
    position_acceptance_rate: list[float] = field(default_factory=list)  # c_j / D; [] undefined
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0

    def __getitem__(self, name: str) -> float | int | list[float] | None:
        if name not in _FIELDS:
            raise KeyError(name)
        value: float | int | list[float] | None = getattr(self, name)
        return value

    def as_dict(self) -> dict[str, float | int | list[float] | None]:
        """By name (JSON)."""
        out: dict[str, float | int | list[float] | None] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, list) else value
        return out


_FIELDS = frozenset(f.name for f in fields(Figures))


def figures_from_increase(inc: SpecCounters) -> Figures:
    """The MTP figures from counter increases (see `Figures`)."""
    d, t, a, c = inc.drafts, inc.draft_tokens, inc.accepted, inc.per_position
    if d <= 0:
        return Figures(drafts=d, draft_tokens=t, accepted_tokens=a)
    k_mean = t / d
    k = _whole(k_mean)
    error_propagation = None
    if k is not None and k >= 1 and t > 0 and (k == 1 or len(c) >= k):
        c_last = c[k - 1] if k >= 1 and len(c) >= k else 0.0
        waste = d * (k - 1) - a + c_last
        error_propagation = max(waste, 0.0) / t
    return Figures(
        hit_rate=c[0] / d if c else None,
        acceptance_rate=_ratio(a, t),
        mean_acceptance_length=1 + a / d,
        avg_k_used=a / d,
        error_propagation_rate=error_propagation,
        num_speculative_tokens=k if k is not None else k_mean,
        position_acceptance_rate=[cj / d for cj in c],
        drafts=d,
        draft_tokens=t,
        accepted_tokens=a,
    )


def figures(
    now: Snapshot | SpecCounters | str, then: Snapshot | SpecCounters | str | None = None
) -> Figures:
    """The MTP figures over the increase from `then` to `now` (or since start if then=None).

    `now`/`then` may be snapshots from spec_snapshot(), SpecCounters, or exposition text.
    """
    if isinstance(now, str):
        now = spec_snapshot(now)
    if isinstance(then, str):
        then = spec_snapshot(then)
    return figures_from_increase(increase(now, then))


def stats(exposition: str | Exposition) -> dict[str, float | int | None]:
    """Figures from one exposition, cumulative since the counters started (`mtp-runtime stats`)."""
    f = figures_from_increase(total(spec_snapshot(exposition)))
    six = (
        f.hit_rate,
        f.acceptance_rate,
        f.mean_acceptance_length,
        f.avg_k_used,
        f.error_propagation_rate,
        f.num_speculative_tokens,
    )
    return dict(zip(STATS_KEYS, six, strict=True))


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

    def figures(self, now: float | None = None) -> Figures:
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
