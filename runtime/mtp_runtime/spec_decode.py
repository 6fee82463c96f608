"""vLLM's spec-decode counters: their names, read per engine series from an exposition, and
their increase between two snapshots.

Counters (vLLM 0.33.0, labels `engine`, `model_name`; the last one also `position`):

- D  `vllm:spec_decode_num_drafts_total`                       drafts (speculation steps)
- T  `vllm:spec_decode_num_draft_tokens_total`                 draft tokens (= D·K)
- A  `vllm:spec_decode_num_accepted_tokens_total`              accepted draft tokens
- c_j `vllm:spec_decode_num_accepted_tokens_per_pos_total{position="j"}`

Counter resets (vLLM restarted) are handled per series the way PromQL's increase() does: a
counter lower than before counts from zero again, so the increase is its new value. A series
that did not exist in the older snapshot counts from zero (vLLM creates its counters at 0).
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mtp_runtime.exposition import Exposition, parse_exposition

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SPEC_DECODE_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)


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


# Every spec-decode sample name starts with this (and nothing else vLLM writes does, except
# their `*_created` companions, which spec_snapshot() skips).
SPEC_DECODE_PREFIX = "vllm:spec_decode_num_"


def spec_lines(text: str) -> str:
    """The sample lines of `text` whose name starts with SPEC_DECODE_PREFIX, joined.

    A real vLLM exposition is ~50 KB of histograms; the spec-decode samples are ~15 lines of
    it. str.find() skips the rest without looking at it line by line, so spec_snapshot()
    parses a few hundred bytes instead of the whole text (about 40 times less work).
    A sample line starts at the beginning of a line (HELP/TYPE lines start with '#').
    """
    marker = "\n" + SPEC_DECODE_PREFIX
    if text.startswith(SPEC_DECODE_PREFIX):
        start = 0
    else:
        start = text.find(marker) + 1
        if start == 0:
            return ""
    out: list[str] = []
    while True:
        end = text.find("\n", start)
        if end < 0:
            out.append(text[start:])
            break
        out.append(text[start:end])
        start = text.find(marker, end) + 1
        if start == 0:
            break
    return "\n".join(out)


def _key(labels: Mapping[str, str]) -> SeriesKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "position"))


def spec_snapshot(
    source: str | Exposition, match: Mapping[str, str] | None = None
) -> dict[SeriesKey, SpecCounters]:
    """The spec-decode counters in an exposition, per engine series.

    `match` keeps only series whose labels include these pairs (e.g. {"model_name": "x"}).
    Returns {} when the exposition has no spec-decode counters (speculation off).
    Text is pre-filtered with spec_lines(): lines of other families are not parsed, so a
    malformed line elsewhere does not hide the spec-decode counters. Text that names the
    counters only on lines that do not start with them (indented samples) is parsed whole.
    """
    if isinstance(source, str):
        lines = spec_lines(source)
        if not lines and SPEC_DECODE_PREFIX in source:
            lines = source
        exp = parse_exposition(lines)
    else:
        exp = source
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
