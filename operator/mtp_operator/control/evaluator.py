"""The built-in evaluator's I/O: scrape each pool's pods, feed the pure evaluator, act.

For clusters without Prometheus/Alertmanager (it is on by default). Every `interval` seconds
it reads vLLM's /metrics on each Ready pod of each pool whose resource has rollback enabled,
applies that resource's own thresholds (`rollback.evaluation.PoolEvaluator`), and hands firing
signals to the same `apply_signals` the webhook uses.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import aiohttp

from mtp_operator.adapters.scrape import MAX_PARALLEL_SCRAPES, SCRAPE_TIMEOUT, scrape_pod
from mtp_operator.adapters.telemetry import OPERATOR_METRICS
from mtp_operator.control.rollback import RollbackActions
from mtp_operator.rollback.evaluation import PoolEvaluator, pool_snapshot
from mtp_operator.rollback.signals import PoolRef
from mtp_operator.validation import spec_problems

log = logging.getLogger(__name__)


class Evaluator:
    def __init__(self, actions: RollbackActions) -> None:
        self.actions = actions
        self.pools: dict[PoolRef, PoolEvaluator] = {}

    async def tick(self, session: aiohttp.ClientSession, now: datetime) -> int:
        """One round over every pool; returns how many signals were handed on."""
        view, reconciler = self.actions.view, self.actions.reconciler
        if not getattr(view, "ready", True):
            return 0
        sem = asyncio.Semaphore(MAX_PARALLEL_SCRAPES)
        work: list[tuple[PoolRef, Any, int, dict[str, str]]] = []
        for key in list(view.resource_keys()):
            body = view.resource(key)
            if body is None:
                continue
            spec, problems = spec_problems(body.get("spec") or {})
            if spec is None or problems or not spec.rollback.enabled:
                continue
            for pool in reconciler.current_status(key, body).pools:
                ref = PoolRef(key[0], key[1], pool.gpu_product)
                pods = view.pool_pod_ips(key, pool.gpu_product)
                if pods:
                    work.append((ref, spec.rollback, pool.num_speculative_tokens, pods))
        seen = {ref for ref, *_ in work}
        for gone in set(self.pools) - seen:
            del self.pools[gone]

        async def evaluate(ref: PoolRef, rollback: Any, k: int, pods: dict[str, str]):
            scraped = await asyncio.gather(*(scrape_pod(session, ip, sem) for ip in pods.values()))
            for snap in scraped:
                OPERATOR_METRICS.evaluator_scrapes.labels(
                    ref.namespace, ref.mtpinference, ref.gpu_product,
                    "ok" if snap else "failed").inc()
            per_pod = {name: snap for name, snap in zip(pods, scraped, strict=True) if snap}
            if not per_pod:
                return []
            evaluator = self.pools.setdefault(ref, PoolEvaluator(ref))
            return evaluator.observe(now, pool_snapshot(per_pod), rollback, k=k).signals

        results = await asyncio.gather(*(evaluate(*w) for w in work))
        signals = [s for batch in results for s in batch]
        if signals:
            await self.actions.apply_signals(signals)
        return len(signals)


async def run_evaluator(actions: RollbackActions, interval: float) -> None:
    evaluator = Evaluator(actions)
    async with aiohttp.ClientSession(timeout=SCRAPE_TIMEOUT) as session:
        while True:
            try:
                await evaluator.tick(session, datetime.now(UTC))
            except Exception:  # keep evaluating: one bad round must not stop rollbacks
                log.exception("evaluator round failed")
            await asyncio.sleep(interval)
