"""Acting on rollback signals: the I/O around the pure policy.

Both ways in (Alertmanager's webhook and the built-in evaluator) end in `apply_signals`:
for each signal it finds the pool and asks `policy.decide`; the decisions are values, handed
to one reconcile pass of the resource, which folds them into the status (pin, history, alert
times; `rollback.state.with_decisions`), rolls exactly the affected pools' Deployments to the
new K and writes the status once (the reconciler is the one status writer). Then each
rollback is announced with an Event and counted. It runs under the resource's reconcile
lock, so a rollback and a reconcile never interleave.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from mtp_operator.adapters.telemetry import OPERATOR_METRICS
from mtp_operator.control.ports import ClusterView, Key, Kube
from mtp_operator.control.reconciler import Reconciler, TransientReconcileError
from mtp_operator.events import REASON_SPECULATION_ROLLED_BACK, speculation_rolled_back
from mtp_operator.naming import label_value
from mtp_operator.planning import PlanError, plan_pool
from mtp_operator.rollback.policy import Decision, PoolRollbackState, decide
from mtp_operator.rollback.signals import AlertSignal
from mtp_operator.rollback.state import with_decisions
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
        kube: Kube,
        view: ClusterView,
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
        # Pod labels (so alert labels) carry names over 63 characters cut and hashed
        # (naming.label_value): map such a value back to the resource it stands for.
        hashed = {
            (ns, label_value(name)): name
            for ns, name in self.view.resource_keys()
            if label_value(name) != name
        }
        for sig in signals:
            ns, name = sig.target.namespace, sig.target.mtpinference
            name = hashed.get((ns, name), name)
            if name != sig.target.mtpinference:
                sig = replace(sig, target=replace(sig.target, mtpinference=name))
            by_resource[(ns, name)].append(sig)
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
        spec, problems = spec_problems(body.get("spec") or {})
        if spec is None or problems:
            outcome.unchanged += len(sigs)  # an invalid spec is not acted on until fixed
            return
        slot = self.reconciler.slot(key)
        async with slot.lock:
            generation = (body.get("metadata") or {}).get("generation")
            status = self.reconciler.current_status(key, body)
            decisions: list[Decision] = []
            # a pool's state after this batch's earlier signals: status carries the rollback
            # fields but not the K the pass will roll to, so the next signal starts from here
            states: dict[str, PoolRollbackState] = {}
            by_label = {
                label_value(p.gpu_product): p.gpu_product
                for p in status.pools
                if label_value(p.gpu_product) != p.gpu_product
            }
            for sig in sigs:
                product = by_label.get(sig.target.gpu_product, sig.target.gpu_product)
                if product != sig.target.gpu_product:
                    sig = replace(sig, target=replace(sig.target, gpu_product=product))
                pool = next((p for p in status.pools if p.gpu_product == product), None)
                if pool is None:
                    outcome.unknown.append(f"{key[0]}/{key[1]}/{product}")
                    continue
                try:
                    spec_k = plan_pool(spec, product, self.reconciler.settings.gpu_profiles).k
                except PlanError:
                    outcome.unchanged += 1
                    continue
                state = states.get(product) or PoolRollbackState.from_pool_status(
                    pool, spec_k, spec.speculative.mtp_layers
                )
                decision = decide(state, sig, spec.rollback, self.clock(), generation)
                states[product] = decision.state
                after = with_decisions(status, [decision])  # the next signal sees this one
                if after != status:
                    decisions.append(decision)
                    status = after
                if decision.record is None:
                    outcome.unchanged += 1
                    log.debug(  # per signal: the receiver logs one line per request
                        "%s/%s %s: %s", key[0], key[1], product, decision.reason
                    )
                    continue
                outcome.rolled_back += 1
                OPERATOR_METRICS.rollbacks.labels(key[0], key[1], product, sig.alert).inc()
                log.warning("%s/%s %s: %s", key[0], key[1], product, decision.reason)
            if not decisions:
                return
            records = [d.record for d in decisions if d.record is not None]
            failed: TransientReconcileError | None = None
            try:
                # One pass: the decisions into status, exactly the affected pools rolled.
                await self.reconciler.reconcile_locked(key, decisions)
            except TransientReconcileError as err:
                failed = err  # status (with the rollbacks) is written; a pool write failed
            if records and failed is None:
                OPERATOR_METRICS.signal_to_patch.observe(time.monotonic() - received)
        # Events after the lock: the next alert for this resource need not wait for them
        for rec in records:
            await self.kube.event(
                body, REASON_SPECULATION_ROLLED_BACK, speculation_rolled_back(rec), "Warning"
            )
        if failed is not None:
            raise failed
