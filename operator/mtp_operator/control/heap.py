"""The operator's heap and Python's cyclic garbage collector.

At scale the operator holds every watched object (kopf's indexes: thousands of resources,
Deployments, Services, pods) and the evaluator's windows. Left to itself, Python's collector
walks all of them in every full (generation 2) pass: at 4,000 pods that was a 0.77 s pause,
four times in 75 s, 2.8 CPU-s (bench/scale/scale_evaluator.py, gc.callbacks), each pause a delay
for every scrape and decision due in it. Almost none of it is garbage: the watched objects
are plain dicts freed by reference counting when an event replaces them.

So, once the first full index is done, the collector is told to leave what lives then alone
(`gc.freeze()`: moved to a permanent generation the passes skip), after one full pass so
that nothing already garbage is kept. Objects that become cyclic garbage while frozen would
be kept until the next refreeze, so every REFREEZE_SECONDS the frozen objects are handed
back, collected once, and frozen again: one full pass every ten minutes instead of every
twenty seconds.

Before that, while kopf lists and indexes every object, the heap grows by thousands of live
objects a second, and each full pass walked all of it again: at 250 resources 0.59 of the
restart's 2.67 CPU-seconds were the collector's (gc.callbacks), 0.42 of them its full
passes. So until the first full index is done, what was allocated is frozen every
STARTING_FREEZE_SECONDS (a freeze only moves the collector's lists: no walk); cycles that
became garbage meanwhile are collected by the first refreeze, or by a refreeze every
REFREEZE_SECONDS should the index never be whole (an API server away at start-up). Not
after it: freezing on through the settle time, when a rollout may be under way, cost a
250-resource rollout more CPU than the collector saved (operator 12.6-13.3 CPU-s against
11.9, bench/scale/run.py at 250 resources, one round each).
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
STARTING_FREEZE_SECONDS = 0.5


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
    step: float = STARTING_FREEZE_SECONDS,
) -> None:
    """Freeze every `step` seconds until `ready()` first holds (and refreeze every `every`
    seconds meanwhile); refreeze `settle` seconds after it, and again every `every`
    seconds, until cancelled."""
    loop = asyncio.get_running_loop()
    last_full = loop.time()
    while not ready():
        if loop.time() - last_full >= every:
            refreeze()
            last_full = loop.time()
        else:
            gc.freeze()
        await asyncio.sleep(step)
    await asyncio.sleep(settle)
    while True:
        seconds = refreeze()
        log.debug("heap frozen: %d objects, %.3f s", gc.get_freeze_count(), seconds)
        await asyncio.sleep(every)
