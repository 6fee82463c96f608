"""A batch-size schedule from a pool's measurements at several loads. Pure.

vLLM's `num_speculative_tokens_per_batch_size` picks each engine step's K from the number of
requests in it. When the pool's windows at different concurrencies (rounded to whole batch
sizes) have different best measured K, the schedule gives each load its own K: a range per
concurrency band, split halfway between neighbouring bands, the first from batch size 1, the
last open-ended (vLLM carries the last K forward to any larger batch). Only bands with
windows at two or more K count, and only measured K (never an estimate) are used.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from .estimator import Measurement

OPEN_END = 4096  # the last range's end: vLLM caps ranges at max_num_seqs anyway


def best_by_band(table: Sequence[Measurement]) -> dict[int, int]:
    """{batch size band: best measured K} over bands with windows at two or more K."""
    tps: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for m in table:
        if m.concurrency is not None and m.concurrency > 0:
            tps[max(1, round(m.concurrency))][m.k].append(m.output_tps)
    out = {}
    for band, by_k in tps.items():
        if len(by_k) >= 2:
            out[band] = max(by_k, key=lambda k: sum(by_k[k]) / len(by_k[k]))
    return out


def recommend_schedule(table: Sequence[Measurement]) -> list[tuple[int, int, int]] | None:
    """(first batch size, last, K) ranges, or None when one K is best at every load seen."""
    best = best_by_band(table)
    if len(set(best.values())) < 2:
        return None
    bands = sorted(best)
    ranges: list[tuple[int, int, int]] = []
    start = 1
    for i, band in enumerate(bands):
        end = (band + bands[i + 1]) // 2 if i + 1 < len(bands) else OPEN_END
        end = max(end, start)
        if ranges and ranges[-1][2] == best[band]:
            ranges[-1] = (ranges[-1][0], end, best[band])
        else:
            ranges.append((start, end, best[band]))
        start = end + 1
    return ranges
