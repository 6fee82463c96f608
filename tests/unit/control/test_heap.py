"""control/heap.py: what lives once the first full index is done is frozen (skipped by the
collector's passes), and a refreeze still collects cycles that became garbage meanwhile."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from mtp_operator.control import heap

pytestmark = pytest.mark.unit


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture(autouse=True)
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_cycle_frozen_while_alive_is_collected_by_the_next_refreeze() -> None:
    node = Node()
    ref = weakref.ref(node)
    gc.freeze()
    del node
    gc.collect()
    assert ref() is not None  # frozen: the passes skip it
    heap.refreeze()
    assert ref() is None and gc.get_freeze_count() > 0


def _counting(monkeypatch) -> list[int]:
    refreezes: list[int] = []
    real = heap.refreeze

    def counted() -> float:
        refreezes.append(1)
        return real()

    monkeypatch.setattr(heap, "refreeze", counted)
    return refreezes


async def _until(cond, tries: int = 500) -> None:
    for _ in range(tries):  # a full pass of a big test process takes a while
        if cond():
            return
        await asyncio.sleep(0.01)


async def test_starting_heap_is_frozen_as_it_grows_and_collected_once_ready(monkeypatch) -> None:
    """While starting (the index not yet whole) what was allocated is frozen every `step`
    without a full pass; settle seconds after the index is whole one refreeze collects the
    cycles that became garbage meanwhile, and refreezes follow every `every` seconds."""
    refreezes = _counting(monkeypatch)
    ready = False
    task = asyncio.create_task(
        heap.keep_heap_frozen(lambda: ready, settle=0.05, every=0.2, step=0.01)
    )
    node = Node()  # allocated while starting
    ref = weakref.ref(node)
    await _until(lambda: gc.get_freeze_count() > 0)
    await asyncio.sleep(0.05)  # a few freezes later
    del node
    gc.collect()
    assert ref() is not None and not refreezes  # frozen as it came, no full pass yet
    ready = True
    await _until(lambda: bool(refreezes))
    assert refreezes and ref() is None  # the first refreeze collected it
    await _until(lambda: len(refreezes) >= 3)
    task.cancel()
    assert len(refreezes) >= 3


async def test_a_start_that_never_ends_still_collects_every_interval(monkeypatch) -> None:
    """An index that never becomes whole (API server away) does not keep garbage frozen
    for good: a refreeze every `every` seconds all the same."""
    refreezes = _counting(monkeypatch)
    task = asyncio.create_task(
        heap.keep_heap_frozen(lambda: False, settle=0.05, every=0.1, step=0.01)
    )
    node = Node()
    ref = weakref.ref(node)
    await asyncio.sleep(0.03)
    del node
    await _until(lambda: len(refreezes) >= 2)
    task.cancel()
    assert len(refreezes) >= 2 and ref() is None


def test_collector_time_is_counted_once_per_generation() -> None:
    """mtp_operator_gc_seconds_total: the full passes' CPU time shows under generation 2
    (the callback is installed once, however often it is asked for)."""
    from mtp_operator.adapters.telemetry import REGISTRY, count_gc_seconds

    def seconds(generation: str) -> float:
        value = REGISTRY.get_sample_value(
            "mtp_operator_gc_seconds_total", {"generation": generation}
        )
        return value or 0.0

    count_gc_seconds()
    count_gc_seconds()
    installed = [cb for cb in gc.callbacks if getattr(cb, "__qualname__", "").startswith(
        "count_gc_seconds")]
    assert len(installed) == 1
    before = seconds("2")
    keep = [[Node() for _ in range(1000)] for _ in range(50)]  # something to walk
    for _ in range(3):
        gc.collect(2)
    assert seconds("2") > before
    del keep
