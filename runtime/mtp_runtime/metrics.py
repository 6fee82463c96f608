"""MTP health figures from vLLM's spec-decode counters: exposition parser and pure maths.

Pure and shared: the runtime's exporter and the operator's built-in evaluator both compute
their numbers here, so they always agree with each other and with the definitions in
shared/mtp-metrics.md (and the recording rules written from it). No I/O, no clock: callers
pass exposition text and timestamps in.

Counters (vLLM 0.33.0, labels `engine`, `model_name`; the last one also `position`):

- D  `vllm:spec_decode_num_drafts_total`                       drafts (speculation steps)
- T  `vllm:spec_decode_num_draft_tokens_total`                 draft tokens (= D·K)
- A  `vllm:spec_decode_num_accepted_tokens_total`              accepted draft tokens
- c_j `vllm:spec_decode_num_accepted_tokens_per_pos_total{position="j"}`

Figures, from the INCREASES of those counters between two snapshots (or over a window):

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

Counter resets (vLLM restarted) are handled per series the way PromQL's increase() does: a
counter lower than before counts from zero again, so the increase is its new value. A series
that did not exist in the older snapshot counts from zero (vLLM creates its counters at 0).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SPEC_DECODE_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)

# The keys of `figures()` that `mtp-runtime stats` prints, in this order.
STATS_KEYS = (
    "hit_rate",
    "acceptance_rate",
    "mean_acceptance_length",
    "avg_k_used",
    "error_propagation_rate",
    "num_speculative_tokens",
)


# ---------------------------------------------------------------------------------------------
# Prometheus text exposition (format 0.0.4, and the OpenMetrics subset vLLM could emit)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass
class Exposition:
    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)  # family name → counter/gauge/...
    helps: dict[str, str] = field(default_factory=dict)

    def family(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]


class ParseError(ValueError):
    pass


def _parse_labels(text: str, i: int, lineno: int) -> tuple[dict[str, str], int]:
    """Parse `{a="x",b="y"}` starting at text[i] == '{'; returns labels and the index after '}'."""
    labels: dict[str, str] = {}
    i += 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t,":
            i += 1
        if i >= n:
            raise ParseError(f"line {lineno}: unterminated label set")
        if text[i] == "}":
            return labels, i + 1
        eq = text.find("=", i)
        if eq < 0:
            raise ParseError(f"line {lineno}: label without '='")
        key = text[i:eq].strip()
        i = eq + 1
        while i < n and text[i] in " \t":
            i += 1
        if i >= n or text[i] != '"':
            raise ParseError(f"line {lineno}: label value must be quoted")
        i += 1
        out: list[str] = []
        while True:
            if i >= n:
                raise ParseError(f"line {lineno}: unterminated label value")
            ch = text[i]
            if ch == "\\" and i + 1 < n:
                nxt = text[i + 1]
                out.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
                i += 2
                continue
            if ch == '"':
                i += 1
                break
            out.append(ch)
            i += 1
        labels[key] = "".join(out)


def _parse_value(token: str, lineno: int) -> float:
    special = {"+inf": math.inf, "inf": math.inf, "-inf": -math.inf, "nan": math.nan}
    try:
        return special[token.lower()] if token.lower() in special else float(token)
    except ValueError as exc:
        raise ParseError(f"line {lineno}: bad sample value {token!r}") from exc


def parse_exposition(text: str) -> Exposition:
    """Parse a Prometheus text exposition into samples plus the HELP/TYPE of each family."""
    exp = Exposition()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP"):
                rest = parts[3] if len(parts) > 3 else ""
                if parts[1] == "TYPE":
                    exp.types[parts[2]] = rest.strip()
                else:
                    exp.helps[parts[2]] = rest
            continue
        brace = line.find("{")
        space = min((p for p in (line.find(" "), line.find("\t")) if p >= 0), default=-1)
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            labels, end = _parse_labels(line, brace, lineno)
            rest = line[end:].split()
        else:
            if space < 0:
                raise ParseError(f"line {lineno}: sample without value")
            name = line[:space]
            labels = {}
            rest = line[space:].split()
        if not rest:
            raise ParseError(f"line {lineno}: sample without value")
        exp.samples.append(Sample(name.strip(), labels, _parse_value(rest[0], lineno)))
    return exp


# ---------------------------------------------------------------------------------------------
# Spec-decode counters


@dataclass(frozen=True)
class SpecCounters:
    """The four spec-decode counters of one vLLM engine (or their sum, or their increase)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: tuple[float, ...] = ()  # c_0, c_1, ... indexed by draft position

    def __add__(self, other: SpecCounters) -> SpecCounters:
        n = max(len(self.per_position), len(other.per_position))
        a = self.per_position + (0.0,) * (n - len(self.per_position))
        b = other.per_position + (0.0,) * (n - len(other.per_position))
        return SpecCounters(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            tuple(x + y for x, y in zip(a, b, strict=True)),
        )

    def values(self) -> tuple[float, ...]:
        return (self.drafts, self.draft_tokens, self.accepted, *self.per_position)


# Identifies one vLLM series set: its labels except `position` (e.g. engine, model_name).
SeriesKey = tuple[tuple[str, str], ...]
# One scrape: the counters of each engine series found in it.
Snapshot = Mapping[SeriesKey, SpecCounters]


def _key(labels: Mapping[str, str]) -> SeriesKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "position"))


def spec_snapshot(
    source: str | Exposition, match: Mapping[str, str] | None = None
) -> dict[SeriesKey, SpecCounters]:
    """The spec-decode counters in an exposition, per engine series.

    `match` keeps only series whose labels include these pairs (e.g. {"model_name": "x"}).
    Returns {} when the exposition has no spec-decode counters (speculation off).
    """
    exp = parse_exposition(source) if isinstance(source, str) else source
    scalars: dict[SeriesKey, dict[str, float]] = {}
    positions: dict[SeriesKey, dict[int, float]] = {}
    for s in exp.samples:
        if s.name not in SPEC_DECODE_COUNTERS:
            continue
        if match and any(s.labels.get(k) != v for k, v in match.items()):
            continue
        key = _key(s.labels)
        if s.name == ACCEPTED_PER_POS:
            try:
                pos = int(s.labels.get("position", ""))
            except ValueError:
                continue
            positions.setdefault(key, {})[pos] = s.value
        else:
            scalars.setdefault(key, {})[s.name] = s.value
    out: dict[SeriesKey, SpecCounters] = {}
    for key in scalars.keys() | positions.keys():
        sc = scalars.get(key, {})
        pos = positions.get(key, {})
        per = tuple(pos.get(j, 0.0) for j in range(max(pos) + 1)) if pos else ()
        out[key] = SpecCounters(
            sc.get(DRAFTS, 0.0), sc.get(DRAFT_TOKENS, 0.0), sc.get(ACCEPTED, 0.0), per
        )
    return out


def total(snapshot: Snapshot | SpecCounters) -> SpecCounters:
    """The sum over all engine series of a snapshot."""
    if isinstance(snapshot, SpecCounters):
        return snapshot
    result = SpecCounters()
    for counters in snapshot.values():
        result = result + counters
    return result


def _series_increase(now: SpecCounters, then: SpecCounters | None) -> SpecCounters:
    if then is None:
        return now
    n = max(len(now.per_position), len(then.per_position))
    now_v = (now.drafts, now.draft_tokens, now.accepted, *now.per_position)
    then_v = (then.drafts, then.draft_tokens, then.accepted, *then.per_position)
    now_v += (0.0,) * (3 + n - len(now_v))
    then_v += (0.0,) * (3 + n - len(then_v))
    # A reset of any of the counters means the process restarted: all count from zero again.
    if any(a < b for a, b in zip(now_v, then_v, strict=True)) or len(then.per_position) > len(
        now.per_position
    ):
        return now
    d = [a - b for a, b in zip(now_v, then_v, strict=True)]
    return SpecCounters(d[0], d[1], d[2], tuple(d[3:]))


def increase(
    now: Snapshot | SpecCounters, then: Snapshot | SpecCounters | None
) -> SpecCounters:
    """How much the counters grew from `then` to `now`, summed over engine series.

    Resets are handled per series (see the module doc). `then=None` means "since the
    counters started": the increase is the counters themselves.
    """
    if then is None:
        return total(now)
    if isinstance(now, SpecCounters) or isinstance(then, SpecCounters):
        return _series_increase(total(now), total(then))
    result = SpecCounters()
    for key, counters in now.items():
        result = result + _series_increase(counters, then.get(key))
    return result


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


__all__: Sequence[str] = (
    "ACCEPTED",
    "ACCEPTED_PER_POS",
    "DRAFTS",
    "DRAFT_TOKENS",
    "STATS_KEYS",
    "CounterWindow",
    "Exposition",
    "ParseError",
    "Sample",
    "SeriesKey",
    "Snapshot",
    "SpecCounters",
    "accepted_prefix_counts",
    "expected_error_propagation",
    "figures",
    "figures_from_increase",
    "increase",
    "parse_exposition",
    "spec_snapshot",
    "stats",
    "total",
)
