"""Acting on rollback signals: the I/O around the pure policy.

Both ways in (Alertmanager's webhook and the built-in evaluator) end in `apply_signals`:
for each signal it finds the pool, asks `policy.decide`, records the outcome in status
(history, condition, alert times), posts an Event, counts it, and lets the reconciler roll
exactly that pool's Deployment to the new K. It runs under the resource's reconcile lock,
so a rollback and a reconcile never interleave.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mtp_operator.adapters.telemetry import OPERATOR_METRICS
from mtp_operator.api.v1alpha1 import MAX_ROLLBACK_HISTORY
from mtp_operator.control.reconciler import Key, Reconciler
from mtp_operator.planning import PlanError, plan_pool
from mtp_operator.rollback.policy import PoolRollbackState, decide
from mtp_operator.rollback.signals import AlertSignal
from mtp_operator.validation import spec_problems

log = logging.getLogger(__name__)


class NotReady(RuntimeError):
    """The operator has not finished its first listing of the cluster; try again shortly."""


@dataclass
class Outcome:
    rolled_back: int = 0
    unchanged: int = 0
    unknown: list[str] = field(default_factory=list)  # "ns/name[/product]" not found


class RollbackActions:
    def __init__(
        self,
        kube: Any,
        view: Any,
        reconciler: Reconciler,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.view = view
        self.reconciler = reconciler
        self.clock = clock

    async def apply_signals(self, signals: Iterable[AlertSignal]) -> Outcome:
        if not getattr(self.view, "ready", True):
            raise NotReady("operator is still listing the cluster")
        received = time.monotonic()
        by_resource: dict[Key, list[AlertSignal]] = defaultdict(list)
        for sig in signals:
            by_resource[(sig.target.namespace, sig.target.mtpinference)].append(sig)
        outcome = Outcome()

        async def one(key: Key, sigs: list[AlertSignal]) -> None:
            await self._apply_to_resource(key, sigs, outcome, received)
            if self.reconciler.slot(key).dirty:
                # a reconcile asked for while we held the lock was deferred to us
                await self.reconciler.reconcile(key)

        # resources are independent: each waits only for its own lock
        await asyncio.gather(*(one(k, s) for k, s in by_resource.items()))
        return outcome

    async def _apply_to_resource(
        self, key: Key, sigs: list[AlertSignal], outcome: Outcome, received: float
    ) -> None:
        body = self.view.resource(key)
        if body is None:
            outcome.unknown += [f"{key[0]}/{key[1]}"] * len(sigs)
            return
        spec, found = spec_problems(body.get("spec") or {})
        if spec is None or found:
            outcome.unchanged += len(sigs)  # an invalid spec is not acted on until fixed
            return
        slot = self.reconciler.slot(key)
        async with slot.lock:
            meta = body.get("metadata") or {}
            generation = meta.get("generation")
            status = self.reconciler.current_status(key, body)
            pools = {p["gpuProduct"]: dict(p) for p in status.get("pools") or []}
            records: list[dict[str, Any]] = []
            touched = False
            for sig in sigs:
                pool = pools.get(sig.target.gpu_product)
                if pool is None:
                    outcome.unknown.append(f"{key[0]}/{key[1]}/{sig.target.gpu_product}")
                    continue
                try:
                    spec_k = plan_pool(
                        spec, sig.target.gpu_product, self.reconciler.settings.gpu_profiles
                    ).k
                except PlanError:
                    outcome.unchanged += 1
                    continue
                state = PoolRollbackState.from_pool_status(
                    pool, spec_k, spec.speculative.mtp_layers
                )
                decision = decide(state, sig, spec.rollback, self.clock(), generation)
                fields = {k: v for k, v in decision.state.status_fields().items()}
                before = dict(pool)
                pool.update(fields)
                for k, v in fields.items():
                    if v is None:
                        pool.pop(k, None)
                touched |= pool != before
                if decision.record is None:
                    outcome.unchanged += 1
                    log.info(
                        "%s/%s %s: %s", key[0], key[1], sig.target.gpu_product, decision.reason
                    )
                    continue
                outcome.rolled_back += 1
                records.append(decision.record.model_dump(by_alias=True, exclude_none=True))
                OPERATOR_METRICS.rollbacks.labels(
                    key[0], key[1], sig.target.gpu_product, sig.alert
                ).inc()
                log.warning("%s/%s %s: %s", key[0], key[1], sig.target.gpu_product, decision.reason)
            if not touched:
                return
            new_status = dict(status)
            new_status["pools"] = [pools[p["gpuProduct"]] for p in status.get("pools") or []]
            history = list(status.get("rollbacks") or []) + records
            new_status["rollbacks"] = history[-MAX_ROLLBACK_HISTORY:]
            await self.reconciler.write_status(key, body, status, new_status)
            for rec in records:
                await self.kube.event(
                    body,
                    "SpeculationRolledBack",
                    f"pool {rec['gpuProduct']}: K {rec['fromK']} -> {rec['toK']} ({rec['reason']},"
                    f" via {rec.get('via')})",
                    "Warning",
                )
            if records:
                # Roll exactly the affected pools now, under the same lock.
                await self.reconciler.reconcile_locked(key)
                OPERATOR_METRICS.signal_to_patch.observe(time.monotonic() - received)
