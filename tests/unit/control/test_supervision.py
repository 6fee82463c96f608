"""Background work never dies silently, and /readyz says when the operator can serve."""

from __future__ import annotations

import asyncio
import logging

import pytest

from mtp_operator.adapters.telemetry import OPERATOR_METRICS
from mtp_operator.control.supervision import Health, run_with_crd, supervise


def _failures(task: str) -> float:
    return OPERATOR_METRICS.task_failures.labels(task)._value.get()


def test_ready_only_when_leading_crd_served_indexed_and_nothing_down() -> None:
    indexed = {"done": False}
    h = Health(lambda: indexed["done"])
    assert "not leading" in h.problems()
    h.leading = True
    assert any("CRD" in p for p in h.problems())
    h.crd_served = True
    assert h.problems() == ["indexing the cluster"]
    indexed["done"] = True
    assert h.problems() == []
    h.down["evaluator"] = "restarting"
    assert h.problems() == ["evaluator: restarting"]


async def test_a_crashing_task_is_logged_counted_restarted_and_shown(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="mtp_operator.control.supervision")
    h = Health(lambda: True)
    runs = []
    release = asyncio.Event()
    seen_down = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("scrape exploded")
        if len(runs) == 2:
            return  # a loop that returns has stopped too
        release.set()
        await asyncio.Event().wait()

    async def watch() -> None:
        while not release.is_set():
            if h.down:
                seen_down.append(dict(h.down))
            await asyncio.sleep(0.001)

    before = _failures("t-flaky")
    task = asyncio.create_task(supervise("t-flaky", flaky, h, backoff=(0.02, 0.02)))
    watcher = asyncio.create_task(watch())
    await asyncio.wait_for(release.wait(), 5)
    await watcher
    assert len(runs) == 3 and _failures("t-flaky") - before == 2
    assert seen_down and "t-flaky" in seen_down[0]
    assert h.down == {}  # running again: ready again
    messages = [r.getMessage() for r in caplog.records]
    assert any("t-flaky crashed: RuntimeError: scrape exploded" in m for m in messages)
    assert any("t-flaky stopped unexpectedly" in m for m in messages)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_kopf_runs_only_while_the_crd_is_served(caplog) -> None:
    caplog.set_level(logging.INFO, logger="mtp_operator.control.supervision")
    h = Health(lambda: True)
    served = [False] * 5 + [True] * 3 + [False] * 5 + [True] * 100
    answers = iter(served)
    starts, pauses = [], []
    stopped = asyncio.Event()
    second = asyncio.Event()

    async def probe() -> bool:
        return next(answers)

    async def kopf(stop: asyncio.Event) -> None:
        starts.append(h.crd_served)
        if len(starts) == 2:
            second.set()
        await stop.wait()
        stopped.set()

    task = asyncio.create_task(
        run_with_crd(probe, kopf, lambda: pauses.append(h.crd_served), h, poll=0.001,
                     gone_after=0.0)
    )
    await asyncio.wait_for(second.wait(), 5)
    assert starts == [True, True] and stopped.is_set() and pauses == [False]
    assert h.crd_served
    lines = [r.getMessage() for r in caplog.records]
    assert sum("not served; waiting" in m for m in lines) == 1  # one line, not one per poll
    assert sum("was deleted; paused" in m for m in lines) == 1
    assert sum("CRD is served; starting" in m for m in lines) == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_when_kopf_itself_fails_the_error_reaches_the_caller() -> None:
    h = Health(lambda: True)

    async def probe() -> bool:
        return True

    async def kopf(stop: asyncio.Event) -> None:
        raise RuntimeError("watch failed for good")

    with pytest.raises(RuntimeError, match="for good"):
        await run_with_crd(probe, kopf, lambda: None, h, poll=0.001)


async def test_a_short_404_blip_while_running_is_no_deletion() -> None:
    """Right after an API server restart a custom resource reads as unknown for a moment."""
    h = Health(lambda: True)
    answers = iter([True, False, False, True] + [True] * 10_000)
    pauses: list[bool] = []
    started: list[int] = []

    async def probe() -> bool:
        return next(answers, True)

    async def kopf(stop: asyncio.Event) -> None:
        started.append(1)
        await stop.wait()

    task = asyncio.create_task(
        run_with_crd(probe, kopf, lambda: pauses.append(True), h, poll=0.001, gone_after=5.0)
    )
    await asyncio.sleep(0.2)
    assert started == [1] and pauses == [] and h.crd_served
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
