"""Acting on rollback signals: the I/O around the pure policy.

Both ways in (Alertmanager's webhook and the built-in evaluator) end in `apply_signals`:
for each signal it finds the pool and asks `policy.decide_rollback`; the decisions are
values, folded once into the status (pin, history, alert times;
`rollback.state.with_decisions`) and handed to one reconcile pass of the resource
(`Reconciler.fold_pass`, a `reconcile_plan.Fold`), which plans with that status, rolls
exactly the affected pools' Deployments to the new K and writes the status once (the
reconciler is the one status writer). Then each rollback is announced with an Event and
counted. It runs under the resource's reconcile lock, so a rollback and a reconcile never
interleave; requests for one resource that arrive while its lock is held are decided and
written together by the first to get it (a burst of alerts for one resource's pools costs
one pass, not one each).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from mtp_operator.adapters.kube import urgent_writes
from mtp_operator.adapters.telemetry import OPERATOR_METRICS
from mtp_operator.control.ports import ClusterView, Key, Kube
from mtp_operator.control.reconciler import Reconciler, TransientReconcileError
from mtp_operator.events import REASON_SPECULATION_ROLLED_BACK, speculation_rolled_back_steps
from mtp_operator.naming import (
    ALERT_ROLLBACK_ENABLED,
    LABEL_ALERT_ROLLBACK,
    label_value,
    pool_key,
)
from mtp_operator.planning import PlanError, plan_pool
from mtp_operator.reconcile_plan import Fold
from mtp_operator.rollback.policy import (
    NOT_ALLOWED_BY_RESOURCE,
    PoolRollbackState,
    RollbackDecision,
    allowed_by_resource,
    decide_rollback,
)
from mtp_operator.rollback.signals import AlertSignal
from mtp_operator.rollback.state import with_decisions
from mtp_operator.traffic_classes import class_specs

log = logging.getLogger(__name__)

# A webhook alert for a resource whose namespace has not opted in (adapters/namespaces.py)
NAMESPACE_NOT_OPTED_IN = "namespace_not_opted_in"

# A pass waits for requests still arriving for its resource: until BATCH_QUIET_SECONDS bring
# none, at most BATCH_GATHER_SECONDS (bench/reaction/reaction.py: a burst of 100 alerts at once).
BATCH_QUIET_SECONDS = 0.003
BATCH_GATHER_SECONDS = 0.02
# A request that names more than WIDE_REQUEST_RESOURCES resources (Alertmanager grouping a
# fleet's alerts into one body) runs at most WIDE_REQUEST_PASSES of its passes at a time, and
# its decisions give the event loop back every DECISIONS_PER_YIELD signals: the requests
# beside it (one alert each) then find the API server and the loop free instead of queued
# behind the wide request's writes. With a 5,000-alert body over 25 resources on 2 cores
# (the API server, not the operator, the busy one), one pass at a time kept the single
# alerts beside it under 100 ms where 2 or 4 did not, the body answered ~0.6 s later
# (bench/results/reaction-wide-passes-2026-12-04.md).
WIDE_REQUEST_RESOURCES = 8
WIDE_REQUEST_PASSES = 1
DECISIONS_PER_YIELD = 32


# Errors that come of reading one resource's state (a hand-edited status or spec), not of
# the API server: they end that resource's share of a request, not the request.
STATE_ERRORS = (ArithmeticError, AttributeError, LookupError, TypeError, ValueError)


class NotReady(RuntimeError):
    """The operator has not finished its first listing of the cluster; try again shortly."""


@dataclass
class AlertOutcome:
    rolled_back: int = 0
    unchanged: int = 0
    unknown: list[str] = field(default_factory=list)  # "ns/name[/product]" not found
    # accepted, never acted on, by reason (the webhook counts them in
    # mtp_operator_alerts_ignored_total): not_allowed_by_resource, namespace_not_opted_in
    ignored: Counter[str] = field(default_factory=Counter)


@dataclass
class _Waiting:
    """One request's signals for one resource, waiting for the resource's lock."""

    sigs: list[AlertSignal]
    outcome: AlertOutcome
    done: asyncio.Future[None]


class RollbackActions:
    def __init__(
        self,
        kube: Kube,
        view: ClusterView,
        reconciler: Reconciler,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        namespace_opted_in: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        """`namespace_opted_in`: asked for each namespace a webhook alert acts in (the
        operator setting alerts.requireNamespaceOptIn); None: every namespace may be."""
        self.kube = kube
        self.view = view
        self.reconciler = reconciler
        self.clock = clock
        self.namespace_opted_in = namespace_opted_in
        self._waiting: dict[Key, list[_Waiting]] = defaultdict(list)

    async def apply_signals(self, signals: Iterable[AlertSignal]) -> AlertOutcome:
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
        outcome = AlertOutcome()
        for sig in signals:
            ns, name = sig.target.namespace, sig.target.mtpinference
            name = hashed.get((ns, name), name)
            if self.view.resource((ns, name)) is None:
                # a resource the operator does not know costs nothing: no slot, no pass
                # (anyone with the token may name any resource; issue 36)
                outcome.unknown.append(f"{ns}/{name}")
                continue
            if name != sig.target.mtpinference:
                sig = replace(sig, target=replace(sig.target, mtpinference=name))
            by_resource[(ns, name)].append(sig)
        if self.namespace_opted_in is not None:
            await self._drop_namespaces_not_opted_in(by_resource, outcome)
        wide = len(by_resource) > WIDE_REQUEST_RESOURCES
        passes = asyncio.Semaphore(WIDE_REQUEST_PASSES) if wide else contextlib.nullcontext()

        async def one(key: Key, sigs: list[AlertSignal]) -> None:
            # an alert's writes (its pass, its Events) do not queue behind a rollout's
            with urgent_writes():
                async with passes:
                    try:
                        await self._apply_to_resource(key, sigs, outcome, received, yields=wide)
                    except STATE_ERRORS:
                        # what this resource holds (its status, its spec) cannot be read:
                        # its alerts are not acted on and the rest of the body is; never a
                        # 500 that Alertmanager retries for ever (issue 36). API errors still
                        # raise: a retry may fix those.
                        log.exception("%s/%s: %d alert(s) not acted on: the resource's state "
                                      "could not be read", key[0], key[1], len(sigs))
                        outcome.unchanged += len(sigs)
                        return

        # resources are independent: each waits only for its own lock (and a wide request's
        # share of passes)
        await asyncio.gather(*(one(k, s) for k, s in by_resource.items()))
        return outcome

    async def _drop_namespaces_not_opted_in(
        self, by_resource: dict[Key, list[AlertSignal]], outcome: AlertOutcome
    ) -> None:
        """Webhook alerts act only in namespaces that opted in (issue 36): the others' are
        taken out of `by_resource` and counted. The evaluator's signals come from the
        operator's own scrapes, not from a token holder, and need no opt-in. Only namespaces
        holding a known resource get here, each read once a request."""
        assert self.namespace_opted_in is not None
        refused: set[str] = set()
        answers: dict[str, bool] = {}
        for key in list(by_resource):
            webhook = [s for s in by_resource[key] if s.via == "alertmanager"]
            if not webhook:
                continue
            ns = key[0]
            if ns not in answers:
                answers[ns] = await self.namespace_opted_in(ns)
            if answers[ns]:
                continue
            refused.add(ns)
            outcome.ignored[NAMESPACE_NOT_OPTED_IN] += len(webhook)
            rest = [s for s in by_resource[key] if s.via != "alertmanager"]
            if rest:
                by_resource[key] = rest
            else:
                del by_resource[key]
        if refused:
            shown = sorted(refused)
            log.warning(
                "webhook alerts for namespace(s) %s ignored: not opted in (label "
                "%s=%s on the Namespace; operator setting alerts.requireNamespaceOptIn)",
                ", ".join(shown[:5]) + (f" (+{len(shown) - 5} more)" if len(shown) > 5 else ""),
                LABEL_ALERT_ROLLBACK, ALERT_ROLLBACK_ENABLED,
            )

    async def _apply_to_resource(
        self, key: Key, sigs: list[AlertSignal], outcome: AlertOutcome, received: float,
        yields: bool = False,
    ) -> None:
        """Group commit: requests for one resource that wait for its lock meanwhile are
        decided and written together by the first of them to get it (one status write and one
        apply per pool for the lot, instead of one pass each); every request keeps its own
        outcome and answer. The pass is the reconciler's (`Reconciler.fold_pass`)."""
        me = _Waiting(sigs, outcome, asyncio.get_running_loop().create_future())
        self._waiting[key].append(me)
        batch: list[_Waiting] = []
        body: Mapping[str, Any] | None = None
        records: list = []

        async def fold() -> Fold | None:
            nonlocal body, records
            if me.done.done():  # an earlier holder of the lock took these signals
                return None
            await self._let_arrivals_join(key)
            batch.extend(self._waiting.pop(key, []))
            try:
                body, change = await self._decide(key, batch, yields)
            except BaseException as err:
                _answer(batch, me, err)
                raise
            records = [d.record for d in change.decisions if d.record is not None] if change else []
            return change

        async def then(error: BaseException | None) -> None:  # under the lock
            _answer(batch, me, error)
            if records and error is None:
                OPERATOR_METRICS.signal_to_patch.observe(time.monotonic() - received)

        async def after(_error: TransientReconcileError | None) -> None:
            # Events after the lock: the next alert for this resource need not wait for
            # them. One per pool rolled back: a pass that stepped a pool several times says
            # so once.
            by_pool: dict[str, list] = defaultdict(list)
            for rec in records:
                by_pool[pool_key(rec.gpu_product, rec.traffic_class)].append(rec)
            for steps in by_pool.values():
                await self.kube.event(
                    body, REASON_SPECULATION_ROLLED_BACK, speculation_rolled_back_steps(steps),
                    "Warning",
                )
            await me.done  # raises what the pass that took these signals raised

        await self.reconciler.fold_pass(key, fold, then, after)

    async def _let_arrivals_join(self, key: Key) -> None:
        """Before a pass takes its batch: wait while requests for this resource keep joining
        it (a burst of alerts for its pools arrives within milliseconds): until
        BATCH_QUIET_SECONDS pass with none, for at most BATCH_GATHER_SECONDS. A lone alert
        waits BATCH_QUIET_SECONDS; a burst of one alert per pool is decided and written in
        one pass instead of two (the second waiting for the first's writes)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BATCH_GATHER_SECONDS
        seen = len(self._waiting.get(key, ()))
        while loop.time() < deadline:
            await asyncio.sleep(BATCH_QUIET_SECONDS)
            now = len(self._waiting.get(key, ()))
            if now == seen:
                return
            seen = now

    async def _decide(
        self, key: Key, batch: list[_Waiting], yields: bool = False
    ) -> tuple[Mapping[str, Any] | None, Fold | None]:
        """Decide every waiting signal of one resource (under its lock; with `yields`, the
        loop is given back every DECISIONS_PER_YIELD signals). Returns the body and what the
        pass folds into the status (None: no pass), each decision folded once."""
        body = self.view.resource(key)
        if body is None:
            for w in batch:
                w.outcome.unknown += [f"{key[0]}/{key[1]}"] * len(w.sigs)
            return None, None
        spec, problems = self.reconciler.slot(key).memos.parsed_spec(body)
        if spec is None or problems:
            for w in batch:  # an invalid spec is not acted on until fixed
                w.outcome.unchanged += len(w.sigs)
            return body, None
        generation = (body.get("metadata") or {}).get("generation")
        status = persisted = self.reconciler.current_status(key, body)
        decisions: list[RollbackDecision] = []
        # a pool's state after this batch's earlier signals: status carries the rollback
        # fields but not the K the pass will roll to, so the next signal starts from here
        states: dict[str, PoolRollbackState] = {}
        # a product label cut and hashed (naming.label_value) names its pool as the pods'
        # label does: `label/class` for a class pool
        by_label = {
            pool_key(label_value(p.gpu_product), p.traffic_class): p.key
            for p in status.pools
            if label_value(p.gpu_product) != p.gpu_product
        }
        for i, (sig, outcome) in enumerate((x, w.outcome) for w in batch for x in w.sigs):
            if yields and i % DECISIONS_PER_YIELD == DECISIONS_PER_YIELD - 1:
                await asyncio.sleep(0)
            if not allowed_by_resource(spec.rollback, sig):
                # spec.rollback.alertNames / alertMatchers: not an alert it lets act
                outcome.ignored[NOT_ALLOWED_BY_RESOURCE] += 1
                continue
            product = by_label.get(sig.target.gpu_product, sig.target.gpu_product)
            if product != sig.target.gpu_product:
                sig = replace(sig, target=replace(sig.target, gpu_product=product))
            pool = next((p for p in status.pools if p.key == product), None)
            if pool is None:
                outcome.unknown.append(f"{key[0]}/{key[1]}/{product}")
                continue
            state = states.get(product)
            if state is None:
                try:  # the K the spec gives the pool, once a batch (the pass plans the pin)
                    spec_k = plan_pool(
                        class_specs(spec).get(pool.traffic_class or "", spec), pool.gpu_product,
                        self.reconciler.settings.gpu_profiles,
                    ).k
                except PlanError:
                    outcome.unchanged += 1
                    continue
                state = PoolRollbackState.from_pool_status(
                    pool, spec_k, spec.speculative.mtp_layers
                )
            decision = decide_rollback(state, sig, spec.rollback, self.clock(), generation)
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
            return body, None
        # one pass: the decisions into status (as folded here), exactly the affected pools
        # rolled
        return body, Fold(decisions, folded=(persisted, status))


def _answer(batch: list[_Waiting], me: _Waiting, error: BaseException | None) -> None:
    """Answer the requests a pass took: all alike when it wrote (or a pool write failed,
    TransientReconcileError); on any other error the others get it and the request that ran
    the pass raises it itself."""
    for w in batch:
        if w.done.done():
            continue
        if error is None:
            w.done.set_result(None)
        elif isinstance(error, TransientReconcileError):
            w.done.set_exception(error)
        elif w is me:
            continue
        elif isinstance(error, asyncio.CancelledError):
            w.done.cancel()
        else:
            w.done.set_exception(error)
