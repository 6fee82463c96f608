"""The operator's heap and Python's cyclic garbage collector.

At scale the operator holds every watched object (kopf's indexes: thousands of resources,
Deployments, Services, pods) and the evaluator's windows. Left to itself, Python's collector
walks all of them in every full (generation 2) pass: at 4,000 pods that was a 0.77 s pause,
four times in 75 s, 2.8 CPU-s (bench/scale_evaluator.py, gc.callbacks), each pause a delay
for every scrape and decision due in it. Almost none of it is garbage: the watched objects
are plain dicts freed by reference counting when an event replaces them.

So, once the first full index is done, the collector is told to leave what lives then alone
(`gc.freeze()`: moved to a permanent generation the passes skip), after one full pass so
that nothing already garbage is kept. Objects that become cyclic garbage while frozen would
be kept until the next refreeze, so every REFREEZE_SECONDS the frozen objects are handed
back, collected once, and frozen again: one full pass every ten minutes instead of every
twenty seconds.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

REFREEZE_SECONDS = 600.0
SETTLE_SECONDS = 30.0  # after the first full index: the first passes' objects settle first
READY_POLL_SECONDS = 1.0


def refreeze() -> float:
    """One full pass over everything, then freeze what is left; returns its seconds."""
    t0 = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - t0


async def keep_heap_frozen(
    ready: Callable[[], bool],
    *,
    settle: float = SETTLE_SECONDS,
    every: float = REFREEZE_SECONDS,
) -> None:
    """Refreeze `settle` seconds after `ready()` first holds, then every `every` seconds,
    until cancelled."""
    while not ready():  # noqa: ASYNC110 (kopf's first index sets no event to wait on)
        await asyncio.sleep(READY_POLL_SECONDS)
    await asyncio.sleep(settle)
    while True:
        seconds = refreeze()
        log.debug("heap frozen: %d objects, %.3f s", gc.get_freeze_count(), seconds)
        await asyncio.sleep(every)
