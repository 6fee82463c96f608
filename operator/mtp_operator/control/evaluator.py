"""The built-in evaluator's I/O: scrape each pool's pods, feed the pure evaluator, act.

For clusters without Prometheus/Alertmanager (it is on by default). Every `interval` seconds
it reads vLLM's /metrics on each Ready pod of each pool whose resource has rollback enabled,
applies that resource's own thresholds (`rollback.evaluation.PoolEvaluator`), and hands firing
signals to the same `apply_signals` the webhook uses.

At scale (thousands of pods a round): rounds start every `interval` seconds whatever a round
took (a slow round does not push the next one back); within a round the pools start one after
the other over half the interval, each at the same place every round (an even load, and each
pool read once an interval); each pool's signals are acted on as soon as that pool is
evaluated, not at the end of the round; at most MAX_PARALLEL_SCRAPES scrapes
are in flight, each with its own time-out; and pods whose last scrape failed are scraped in a
lane of their own (SUSPECT_PARALLEL slots), so dead or hanging pods cannot take the slots of
the healthy ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from mtp_operator.adapters.keepalive_http import KeepAliveClient
from mtp_operator.adapters.scrape import MAX_PARALLEL_SCRAPES, scrape_client, scrape_pod_timed
from mtp_operator.adapters.telemetry import OPERATOR_METRICS
from mtp_operator.control.rollback import RollbackActions
from mtp_operator.rollback.evaluation import PoolEvaluator, pool_snapshot
from mtp_operator.rollback.signals import PoolRef
from mtp_runtime.vllm_command import DEFAULT_PORT

log = logging.getLogger(__name__)

# Pods whose last scrape failed or took longer than SLOW_SCRAPE_SECONDS are scraped in a lane
# of their own with this many slots, beside the MAX_PARALLEL_SCRAPES of the others.
SUSPECT_PARALLEL = MAX_PARALLEL_SCRAPES
SLOW_SCRAPE_SECONDS = 1.0
# A round's pools start spread over this part of the interval (Evaluator.tick's `spread`).
SPREAD_FRACTION = 0.5


class Evaluator:
    def __init__(self, actions: RollbackActions, port: int = DEFAULT_PORT) -> None:
        self.actions = actions
        self.port = port
        self.pools: dict[PoolRef, PoolEvaluator] = {}
        self.suspects: set[str] = set()  # pod IPs whose last scrape failed or was slow

    async def tick(self, client: KeepAliveClient, now: datetime, spread: float = 0.0) -> int:
        """One round over every pool; returns how many signals were handed on. With `spread`,
        the pools start one after the other over that many seconds, each at the same place
        in every round (sorted), so each pool is read once an interval and the load is even."""
        view, reconciler = self.actions.view, self.actions.reconciler
        if not getattr(view, "ready", True):
            return 0
        healthy_lane = asyncio.Semaphore(MAX_PARALLEL_SCRAPES)
        suspect_lane = asyncio.Semaphore(SUSPECT_PARALLEL)
        work: list[tuple[PoolRef, Any, int, dict[str, str]]] = []
        for key in list(view.resource_keys()):
            body = view.resource(key)
            if body is None:
                continue
            spec, problems = reconciler.spec_of(key, body)  # parsed once a spec, not a round
            if spec is None or problems or not spec.rollback.enabled:
                continue
            for pool in reconciler.current_status(key, body).pools:
                ref = PoolRef(key[0], key[1], pool.key)  # a class pool: `product/class`
                pods = view.pool_pod_ips(key, pool.key)
                if pods:
                    work.append((ref, spec.rollback, pool.num_speculative_tokens, pods))
        work.sort(key=lambda w: (w[0].namespace, w[0].mtpinference, w[0].gpu_product))
        step = spread / len(work) if work else 0.0
        loop = asyncio.get_running_loop()
        started = loop.time()
        seen = {ref for ref, *_ in work}
        for gone in set(self.pools) - seen:
            del self.pools[gone]
        suspects: set[str] = set()

        async def scrape(ip: str) -> Any:
            lane = suspect_lane if ip in self.suspects else healthy_lane
            snap, seconds = await scrape_pod_timed(client, ip, lane, self.port)
            if snap is None or seconds > SLOW_SCRAPE_SECONDS:
                suspects.add(ip)
            return snap

        async def evaluate(
            i: int, ref: PoolRef, rollback: Any, k: int, pods: dict[str, str]
        ) -> int:
            if step:
                await asyncio.sleep(max(0.0, started + i * step - loop.time()))
            ips = list(pods.values())
            if len(ips) == 1:  # most pools at scale: no task (and gather) for one pod
                scraped = [await scrape(ips[0])]
            else:
                scraped = await asyncio.gather(*(scrape(ip) for ip in ips))
            for snap in scraped:
                OPERATOR_METRICS.evaluator_scrapes.labels(
                    ref.namespace, ref.mtpinference, ref.gpu_product,
                    "ok" if snap else "failed").inc()
            per_pod = {name: snap for name, snap in zip(pods, scraped, strict=True) if snap}
            if not per_pod:
                return 0
            evaluator = self.pools.setdefault(ref, PoolEvaluator(ref))
            when = now + timedelta(seconds=i * step)  # when this pool is read, every round
            signals = evaluator.observe(when, pool_snapshot(per_pod), rollback, k=k).signals
            if signals:  # at once: the rest of the round need not wait for this pool
                await self.actions.apply_signals(signals)
            return len(signals)

        results = await asyncio.gather(*(evaluate(i, *w) for i, w in enumerate(work)))
        self.suspects = suspects
        return sum(results)


RoundHook = Callable[[float, float, int], None]  # (started, finished, signals), loop time

# how far a round's stamp may drift from the wall clock before the cadence is re-anchored
MAX_STAMP_DRIFT = timedelta(seconds=1)


class RoundStamps:
    """The time each round is stamped with: the first round's wall time plus a whole number
    of intervals, not the moment the round woke up.

    A pool's window (rollback.windowSeconds, a multiple of the interval as a rule) takes as
    its base the newest sample at or before `now - window`. Stamped on waking, a round a few
    milliseconds later than the one a window before it lost that sample by chance and took
    the one an interval older: a window an interval too long, whose hit rate still held that
    much more of the time before a drop, so the decision came up to interval x (1 -
    minHitRate/hit rate) late (bench/scale/scale_evaluator.py: crossing -> decision p99 16.56 s at a
    15 s interval). Stamps a whole number of intervals apart make that base exact. The
    cadence is re-anchored when a round overran (restart()) or the stamp drifted from the
    wall clock by more than MAX_STAMP_DRIFT (a clock step)."""

    def __init__(self, interval: float) -> None:
        self.step = timedelta(seconds=interval)
        self.anchor: datetime | None = None
        self.n = 0

    def next(self, wall: datetime) -> datetime:
        if self.anchor is not None:
            stamp = self.anchor + self.step * self.n
            if abs(stamp - wall) <= MAX_STAMP_DRIFT:
                self.n += 1
                return stamp
        self.anchor, self.n = wall, 1
        return wall

    def restart(self) -> None:
        self.anchor = None


async def run_evaluator(
    actions: RollbackActions,
    interval: float,
    *,
    evaluator: Evaluator | None = None,
    on_round: RoundHook | None = None,
) -> None:
    """Rounds every `interval` seconds until cancelled; `on_round` is told each round's start
    and end (loop time) and its signal count (bench/scale/scale_evaluator.py times rounds
    with it)."""
    evaluator = evaluator or Evaluator(actions)
    spread = interval * SPREAD_FRACTION
    loop = asyncio.get_running_loop()
    # idle connections kept past the next round (mtp-runtime starts vLLM with a keep-alive
    # longer than that), one a pod: concurrency is bounded by the lanes, not the client
    client = scrape_client(idle_seconds=2 * interval + 5)
    try:
        due = loop.time()
        stamps = RoundStamps(interval)
        while True:
            started, signals = loop.time(), 0
            try:
                signals = await evaluator.tick(client, stamps.next(datetime.now(UTC)), spread)
            except Exception:  # keep evaluating: one bad round must not stop rollbacks
                log.exception("evaluator round failed")
            if on_round is not None:
                on_round(started, loop.time(), signals)
            # a fixed cadence: the next round starts `interval` after this one started (at
            # once if this one took longer), so each pod is read every `interval` seconds
            late = loop.time() > due + interval
            due = max(due + interval, loop.time())
            if late:  # the round overran: the cadence starts again from here
                stamps.restart()
            await asyncio.sleep(due - loop.time())
    finally:
        await client.close()
