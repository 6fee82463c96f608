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


async def test_frozen_only_once_ready_then_again_every_interval(monkeypatch) -> None:
    monkeypatch.setattr(heap, "READY_POLL_SECONDS", 0.01)
    ready = False
    refreezes: list[int] = []
    real = heap.refreeze

    def counted() -> float:
        refreezes.append(1)
        return real()

    monkeypatch.setattr(heap, "refreeze", counted)
    task = asyncio.create_task(heap.keep_heap_frozen(lambda: ready, settle=0.05, every=0.1))
    await asyncio.sleep(0.1)
    assert not refreezes and gc.get_freeze_count() == 0  # not before the index is whole
    ready = True
    for _ in range(500):  # after `settle` (a full pass of a big test process takes a while)
        if refreezes:
            break
        await asyncio.sleep(0.01)
    assert gc.get_freeze_count() > 0
    for _ in range(500):  # and then again, every 0.1 s
        if len(refreezes) >= 3:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert len(refreezes) >= 3
