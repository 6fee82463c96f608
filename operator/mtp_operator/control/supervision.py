"""Keeps the operator's background work alive and says when the operator can serve.

`Health` is what `/readyz` reports: ready only while this replica leads, the MTPInference CRD
is served, the first full index of the cluster is done, and no background task is down.
`supervise` restarts a crashed or stopped task with a backoff (logged once per crash and
counted in `mtp_operator_task_failures_total`). `run_with_crd` runs kopf only while the CRD
is served: it waits for it at start, pauses when it is deleted and resumes when it is back,
each with one log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from mtp_operator.adapters.telemetry import OPERATOR_METRICS

log = logging.getLogger(__name__)

BACKOFF_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
HEALTHY_AFTER = 60.0  # a task that ran this long before failing starts the backoff anew
CRD_POLL_SECONDS = 2.0
CRD_GONE_SECONDS = 10.0  # a CRD unserved this long while running counts as deleted


class Health:
    def __init__(self, indexed: Callable[[], bool]) -> None:
        self.leading = False
        self.crd_served = False
        self.indexed = indexed  # the first full index of the cluster is done
        self.down: dict[str, str] = {}  # task → why it is not running

    def problems(self) -> list[str]:
        out = []
        if not self.leading:
            out.append("not leading")
        if not self.crd_served:
            out.append("the MTPInference CRD is not served (install crds/)")
        elif not self.indexed():
            out.append("indexing the cluster")
        out += [f"{task}: {why}" for task, why in sorted(self.down.items())]
        return out


async def supervise(
    name: str,
    factory: Callable[[], Awaitable[Any]],
    health: Health,
    backoff: tuple[float, ...] = BACKOFF_SECONDS,
) -> None:
    """Run `factory()` forever: a crash or a return is logged, counted and restarted."""
    failures = 0
    while True:
        started = time.monotonic()
        try:
            await factory()
            log.error("%s stopped unexpectedly", name)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # every crash is reported and restarted
            log.error("%s crashed: %s: %s", name, type(err).__name__, err, exc_info=err)
        OPERATOR_METRICS.task_failures.labels(name).inc()
        failures = 0 if time.monotonic() - started > HEALTHY_AFTER else failures
        delay = backoff[min(failures, len(backoff) - 1)]
        failures += 1
        health.down[name] = f"restarting after a failure (in {delay:g}s)"
        try:
            await asyncio.sleep(delay)
        finally:
            health.down.pop(name, None)


async def run_with_crd(
    crd_served: Callable[[], Awaitable[bool]],
    run_kopf: Callable[[asyncio.Event], Awaitable[Any]],
    on_pause: Callable[[], None],
    health: Health,
    poll: float = CRD_POLL_SECONDS,
    gone_after: float = CRD_GONE_SECONDS,
) -> None:
    """Run kopf while the CRD is served; returns (or raises) when kopf itself ends."""
    waiting_logged = False
    while True:
        if not await _served(crd_served):
            health.crd_served = False
            if not waiting_logged:
                log.warning(
                    "the MTPInference CRD (mtpinferences.mtp-operator.io) is not served; "
                    "waiting for it (kubectl apply -f crds/)"
                )
                waiting_logged = True
            await asyncio.sleep(poll)
            continue
        if waiting_logged:
            log.info("the MTPInference CRD is served; starting")
        waiting_logged = False
        health.crd_served = True
        stop = asyncio.Event()
        operator = asyncio.ensure_future(run_kopf(stop))
        loop = asyncio.get_running_loop()
        missing_since: float | None = None
        try:
            while not operator.done():
                await asyncio.wait({operator}, timeout=poll)
                if operator.done():
                    break
                if await _served(crd_served):
                    missing_since = None
                    continue
                # right after an API server restart a custom resource reads as unknown for a
                # moment: only a CRD missing for `gone_after` seconds is a deleted one
                missing_since = loop.time() if missing_since is None else missing_since
                if loop.time() - missing_since >= gone_after:
                    break
            if operator.done():
                failed = not operator.cancelled() and operator.exception() is not None
                if not failed or await _served(crd_served):
                    return operator.result()
                # kopf's watch hit the missing CRD first (a 404): a pause, not a failure
        except BaseException:
            operator.cancel()
            raise
        log.warning(
            "the MTPInference CRD was deleted; paused until it is installed again"
        )
        health.crd_served = False
        waiting_logged = True
        stop.set()
        try:
            await asyncio.wait_for(operator, timeout=30)
        except (TimeoutError, asyncio.CancelledError):
            operator.cancel()
            with contextlib.suppress(BaseException):
                await operator
        except Exception as err:  # kopf stopping noisily: already paused
            log.debug("kopf stopped with %s", err)
        on_pause()


async def _served(probe: Callable[[], Awaitable[bool]]) -> bool:
    try:
        return await probe()
    except Exception as err:  # the API server away: keep the last answer
        log.debug("CRD probe failed: %s", err)
        return True
