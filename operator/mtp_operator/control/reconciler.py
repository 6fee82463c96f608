"""Brings one MTPInference's pools in line with its spec and the cluster's GPU nodes.

Reads come from in-memory views of the cluster (kopf indexes, see app/handlers.py), so a
reconcile that finds nothing to do makes no API request at all; writes go through kube.Kube.
Each resource is reconciled by one task at a time; a request that arrives while one runs
makes it run once more, never twice in parallel.

The core is composed, as argo-rollouts' per-pass context and its one persisting writer: what
is kept per resource lives in `control.slots.Slot` (by job), a pass's object writes in
`self.writes` (`control.writes.Writes`), the status write here (`_write_status`). What is
decided outside a pass comes in through one method, `fold_pass` (a `reconcile_plan.Fold`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError

from mtp_operator.adapters.telemetry import OPERATOR_METRICS
from mtp_operator.api.v1alpha1 import MTPInferenceStatus
from mtp_operator.control.ports import ClusterView, Key, Kube, ParsedSpec, TransportError
from mtp_operator.control.slots import Slot
from mtp_operator.control.writes import Writes
from mtp_operator.drift import annotations_read
from mtp_operator.events import REASON_PRODUCT_DOES_NOT_FIT, fit_refusals
from mtp_operator.model_cache import cache_problems
from mtp_operator.planning import NodeInventory
from mtp_operator.reconcile_plan import (
    NO_FOLD,
    Applied,
    Fold,
    pass_status,
    plan_pass,
    pool_inputs,
    product_of,
    resource_version,
    significant,
)
from mtp_operator.settings import OperatorSettings
from mtp_operator.status import (
    bad_times,
    observe_deployment,
    read_status,
    status_changed,
    to_wire,
)
from mtp_operator.validation import problems_text

log = logging.getLogger(__name__)

def utcnow() -> datetime:
    return datetime.now(UTC)


# A status change that only reports progress (replica counts, messages, a rollout's
# Progressing condition while the phase stays Progressing: reconcile_plan.significant) is
# coalesced with whatever comes next and written at most every progress_interval() seconds
# per resource; anything a reader acts on (phase, Ready, Degraded, K, generation,
# rollbacks) at once. The interval grows with the number of resources rolling out, so that
# progress reports of all of them together take at most PROGRESS_WRITES_PER_SECOND status
# writes a second: a rollout of a thousand resources then writes each one's status about
# twice (Progressing, Ready) and not once per pool event. A rollout of N resources that the
# cluster brings to Ready at R resources a second lasts about N/R seconds, and each resource
# then gets about PROGRESS_WRITES_PER_SECOND / R progress writes besides its two: at 5/s and
# the ~2 resources a second of bench/scale/run.py's sandbox that was 1.8 extra writes a resource
# (3.82 in all, 1.32x-1.50x the minimum); at 1/s it is about 0.5. Small rollouts (under
# STATUS_COUNTS_INTERVAL x the rate resources) keep their 5 s progress updates.
STATUS_COUNTS_INTERVAL = 5.0
PROGRESS_WRITES_PER_SECOND = 1.0
RETRY_SECONDS = 5.0  # after a failed API request, the next pass of that resource
UNEXPECTED_RETRY_SECONDS = 30.0  # after an error that is not the API server's


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        view: ClusterView,
        settings: OperatorSettings,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.kube = kube
        self.view = view
        self.settings = settings
        self.clock = clock
        self._slots: dict[Key, Slot] = {}
        self._tasks: set[asyncio.Task] = set()
        self._gpu_fingerprint: frozenset = frozenset()
        self._progressing: set[Key] = set()  # resources whose last status written says so
        # the GPU nodes the last pass read and a number that changes whenever they differ
        self._nodes: list[Any] = []
        self._nodes_version = 0
        self._inventory = NodeInventory(())
        # the one writer of a pass's objects (the status is written here: _write_status)
        self.writes = Writes(kube, view, settings, self.slot, lambda: self.clock(),
                             self.reconcile_later)

    def progress_interval(self) -> float:
        """Seconds between two progress-only status writes of one resource."""
        return max(STATUS_COUNTS_INTERVAL, len(self._progressing) / PROGRESS_WRITES_PER_SECOND)

    # ---- scheduling -------------------------------------------------------------------
    def slot(self, key: Key) -> Slot:
        slot = self._slots.get(key)  # looked up first: a Slot (and its lock) costs a build
        if slot is None:
            slot = self._slots[key] = Slot()
        return slot

    def forget(self, key: Key) -> None:
        slot = self._slots.pop(key, None)
        self._progressing.discard(key)
        if slot is not None and slot.turn.later is not None:
            slot.turn.later.cancel()

    def reset(self) -> None:
        """Forget every resource's state (their CRD was deleted; kopf starts afresh)."""
        for key in list(self._slots):
            self.forget(key)
        self._progressing.clear()
        self._gpu_fingerprint = frozenset()
        self._nodes, self._nodes_version = [], self._nodes_version + 1
        self._inventory = NodeInventory(())

    def reconcile_later(self, key: Key, delay: float) -> None:
        """One more pass of `key` in `delay` seconds (one timer per resource; the earliest)."""
        slot = self.slot(key)
        turn = slot.turn
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if turn.later is not None and not turn.later.cancelled():
            if turn.later.when() <= due:
                return
            turn.later.cancel()

        def fire() -> None:
            turn.later = None
            if self._slots.get(key) is slot:
                task = loop.create_task(self.reconcile_or_retry(key))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

        turn.later = loop.call_at(due, fire)

    async def reconcile_or_retry(self, key: Key) -> None:
        """reconcile(), and on an API error another pass in RETRY_SECONDS: the failure is in
        status where it could be written, and a watch event is not delivered twice."""
        try:
            await self.reconcile(key)
        except (TransientReconcileError, ApiError, TransportError) as err:
            log.warning("will retry %s/%s in %.0fs: %s", key[0], key[1], RETRY_SECONDS, err)
            self.reconcile_later(key, RETRY_SECONDS)
        except Exception as err:  # a bug must not stop this resource for good, nor flood logs
            turn = self.slot(key).turn
            text = f"{type(err).__name__}: {err}"
            log.error("reconcile %s/%s failed: %s; retrying in %.0fs", key[0], key[1], text,
                      UNEXPECTED_RETRY_SECONDS, exc_info=err if turn.last_error != text else None)
            turn.last_error = text
            self.reconcile_later(key, UNEXPECTED_RETRY_SECONDS)

    def pool_seen(self, key: Key, body: Mapping[str, Any]) -> None:
        """The watch delivered a pool Deployment event (deletions too): our copy is stale now."""
        slot = self._slots.get(key)
        product = product_of(body) or ""
        ours = slot.ours.pools.get(product) if slot else None
        if ours is not None and resource_version(body) >= resource_version(ours):
            slot.forget_our_pool(product)

    def pool_news(self, key: Key, body: Mapping[str, Any]) -> bool:
        """Whether a pool Deployment's watch event shows what the last pass did not see.
        When it shows nothing new, what the last pass read (and compared for drift) is
        taken from this copy from now on, the one the watch's index keeps: an older equal
        copy of the pool's spec (~6 KB) is then no longer held beside it until a pass comes."""
        slot = self._slots.get(key)
        if slot is None:
            return True
        product = product_of(body) or ""
        seen = slot.seen.pools.get(product)
        if seen is None:
            return True
        version = resource_version(body)
        if version <= seen[0]:
            return False
        inputs = pool_inputs(body, observe_deployment(body))
        if inputs != seen[1]:
            return True
        slot.seen.pools[product] = (version, inputs)
        spec, annotations = inputs[1], annotations_read(body)
        memo = slot.memos.drift.get(product)
        if memo is not None and memo[1] == spec and memo[2] == annotations:
            slot.memos.drift[product] = (memo[0], spec, annotations, memo[3])
        return False

    def own_status_echo(self, key: Key, body: Mapping[str, Any]) -> bool:
        """Whether a watch event of the resource is our own last status write coming back:
        the object the write returned, which that pass planned with (a change by anyone
        else, spec or metadata, has another resourceVersion). In a rollout about one pass in
        six was one of these (~2.1 status writes a resource, ~11 passes), with nothing to do."""
        slot = self._slots.get(key)
        return (slot is not None and slot.ours.status_rv > 0
                and resource_version(body) == slot.ours.status_rv)

    def observed_pools(self, key: Key) -> dict[str, Mapping[str, Any]]:
        """The watched pool Deployments, with our own newer writes the watch hasn't shown."""
        out = dict(self.view.pool_deployments(key))
        slot = self.slot(key)
        for product, ours in list(slot.ours.pools.items()):
            theirs = out.get(product)
            if theirs is not None and resource_version(theirs) >= resource_version(ours):
                slot.forget_our_pool(product)
            else:
                out[product] = ours
        return out

    async def reconcile(self, key: Key) -> None:
        """Reconcile `key`; if one is running, make it run once more and return."""
        turn = self.slot(key).turn
        if turn.lock.locked():
            turn.dirty = True
            return
        async with turn.lock:
            while True:
                turn.dirty = False
                await self.reconcile_locked(key)
                if not turn.dirty:
                    break

    def gpu_inventory_changed(self) -> bool:
        """True when the set of (product, allocatable, schedulable) among nodes has changed."""
        fingerprint = frozenset(
            (n.name, n.product, n.allocatable_gpus, n.capacity_gpus, n.schedulable)
            for n in self.view.gpu_nodes()
        )
        changed = fingerprint != self._gpu_fingerprint
        self._gpu_fingerprint = fingerprint
        return changed

    def nodes_seen(self) -> tuple[NodeInventory, int]:
        """The GPU nodes now, grouped for planning, and their version: the same version while
        they are equal to the nodes read before, in order (a node's heartbeat replaces its
        object with an equal one: the same version), so a pass that recorded a version read
        nodes equal to these; any other list, even an equal one in another order, is a new
        version. The grouping is built once per version, not once per pass."""
        nodes = list(self.view.gpu_nodes())
        if nodes != self._nodes:  # objects compared by identity first, then by value
            self._nodes_version += 1
            self._inventory = NodeInventory(nodes)
        self._nodes = nodes
        return self._inventory, self._nodes_version

    def resource_news(self, key: Key, body: Mapping[str, Any]) -> bool:
        """Whether a watch event of the resource shows a version its last pass did not read
        (a pass that failed schedules its own retry)."""
        slot = self._slots.get(key)
        return slot is None or resource_version(body) != slot.seen.resource_rv

    async def reconcile_for_nodes(self) -> None:
        """Reconcile every resource whose last pass read other GPU nodes than the view has
        now (after a change of the GPU inventory; the others planned with these nodes).
        A resource with no pass yet is left to its own watch event, which always passes it:
        at start-up the first node event comes amid the listed resources' events, and a pass
        started for both would run twice (a pass asked for while one runs runs again)."""
        _, version = self.nodes_seen()
        keys = [
            k for k in self.view.resource_keys()
            if (slot := self._slots.get(k)) is not None and slot.seen.nodes_version != version
        ]
        await self._reconcile_keys(keys)

    async def reconcile_all(self) -> None:
        """Reconcile every resource; one failing (reported in its status) stops no other."""
        await self._reconcile_keys(list(self.view.resource_keys()))

    async def _reconcile_keys(self, keys: list[Key]) -> None:
        results = await asyncio.gather(*(self.reconcile(k) for k in keys), return_exceptions=True)
        for key, result in zip(keys, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("reconcile %s/%s failed: %s", key[0], key[1], result)

    # ---- the work ---------------------------------------------------------------------
    def spec_of(self, key: Key, body: Mapping[str, Any]) -> ParsedSpec:
        """The spec and its problems, parsed once a spec in the slot (`Memos.spec_of`)."""
        return self.slot(key).memos.spec_of(body)

    def current_status(self, key: Key, body: Mapping[str, Any]) -> MTPInferenceStatus:
        """The freshest status we know: the watched body's, or our own newer write."""
        slot = self.slot(key)
        if slot.ours.status is not None and slot.ours.status_rv > resource_version(body):
            return slot.ours.status
        raw = body.get("status")
        memo = slot.memos.read
        if memo is None or memo[0] is not raw:
            memo = (raw, read_status(raw))
            slot.memos.read = memo
            for what in bad_times(memo[1]):  # read as absent, not raised (issue 36)
                log.warning("%s/%s: %s", key[0], key[1], what)
        return memo[1]

    async def _write_status(
        self, key: Key, old: MTPInferenceStatus, new: MTPInferenceStatus
    ) -> None:
        """The one status writer: patches the status subresource when `new` tells the reader
        something `old` (what the server has) doesn't."""
        if not status_changed(old, new):
            return
        ours = self.slot(key).ours
        wait = ours.status_written + self.progress_interval() - time.monotonic()
        if wait > 0 and significant(old) == significant(new):
            self.reconcile_later(key, wait)  # progress only: written with the next change
            return
        out = await self.kube.patch_status(key[0], key[1], to_wire(new))
        ours.status_written = time.monotonic()
        if new.phase == "Progressing":
            self._progressing.add(key)
        else:
            self._progressing.discard(key)
        ours.status = read_status(out.get("status")) if out.get("status") else new
        try:
            ours.status_rv = int(out["metadata"]["resourceVersion"])
        except (KeyError, ValueError, TypeError):
            ours.status_rv = 0
        OPERATOR_METRICS.status_writes.inc()

    async def fold_pass(
        self,
        key: Key,
        fold: Callable[[], Awaitable[Fold | None]],
        then: Callable[[BaseException | None], Awaitable[None]] | None = None,
        after: Callable[[TransientReconcileError | None], Awaitable[None]] | None = None,
    ) -> TransientReconcileError | None:
        """The one way in for what is decided outside a pass (the alert path, so the
        evaluator, and the tuner): under the resource's lock, `fold()` says what to fold
        into one pass (None: no pass) and the pass runs with it; `then(error)`, still under
        the lock, with the pass's error (None: it wrote everything). A pool write's error
        (TransientReconcileError: the status is written) is returned, any other raised.
        After the lock, `after(error)` (it may raise); then, if all went well, a pass asked
        for meanwhile runs (reconcile() deferred it to us), or the slot goes if the
        resource was deleted meanwhile (its watch event forgot it; this made it again)."""
        failed: TransientReconcileError | None = None
        async with self.slot(key).turn.lock:
            change = await fold()
            try:
                if change is not None:
                    await self.reconcile_locked(key, change)
            except TransientReconcileError as err:
                failed = err
            except BaseException as err:
                if then is not None:
                    await then(err)
                raise
            if then is not None:
                await then(failed)
        if after is not None:
            await after(failed)
        if failed is None:
            if self.view.resource(key) is None:
                self.forget(key)
            elif (slot := self._slots.get(key)) is not None and slot.turn.dirty:
                await self.reconcile(key)
        return failed

    async def reconcile_locked(self, key: Key, fold: Fold = NO_FOLD) -> None:
        """One reconcile pass; the caller holds the slot's `turn.lock` (reconcile(),
        fold_pass()). `fold` (rollback decisions, tuning entries) goes into the status first,
        so this pass plans with it and its one status write persists it."""
        body = self.view.resource(key)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return  # deleted: owner references let the garbage collector remove the pools
        try:
            await self._pass(key, body, fold)
        finally:
            # counted when done, so a pass that shows in the counter has made its writes
            OPERATOR_METRICS.reconciles.inc()

    async def _pass(self, key: Key, body: Mapping[str, Any], fold: Fold) -> None:
        meta = body.get("metadata") or {}
        slot = self.slot(key)
        nodes, slot.seen.nodes_version = self.nodes_seen()
        slot.seen.resource_rv = resource_version(body)
        persisted = self.current_status(key, body)
        previous = fold.into(persisted)
        observed_bodies = self.observed_pools(key)
        observed = {p: observe_deployment(d) for p, d in observed_bodies.items()}
        slot.seen.pools = {
            p: (resource_version(d), pool_inputs(d, observed[p]))
            for p, d in observed_bodies.items()
        }
        now = self.clock()
        spec, problems = slot.memos.parsed_spec(body)
        if spec is not None and not problems:  # the cache's claim must exist in the namespace
            problems = cache_problems(
                spec,
                self.settings.model_cache,
                lambda claim: self.view.has_claim(key[0], claim),
                key[0],
            )
        plan = plan_pass(
            spec,
            problems,
            nodes,
            previous,
            meta,
            self.settings.gpu_profiles,
            now,
            existing=observed_bodies,
            grace_seconds=self.settings.pool_removal_grace_seconds,
        )
        applied = Applied()
        if not plan.problems:
            assert plan.spec is not None
            desired = slot.memos.desired_set(
                key, meta.get("uid", ""), plan.spec, plan.pools, self.settings,
                plan.canaries_in_replicas,  # issue 37: not a canary on a spare slot
            )
            try:
                applied = await self.writes.apply(
                    key, body, desired, plan, observed_bodies, previous, fold.rolled_back
                )
            finally:
                desired.release()  # not held between passes (builders.DesiredSet)
        elif plan.fates:  # nothing fits, but pools of products gone for good still go
            applied = Applied(
                removed=await self.writes.remove_pools(key, body, observed_bodies, plan))
        if applied.settings_hashes and slot.ours.pools:
            # our own writes of this pass count as observed (a new pool: its replicas, not 0;
            # an updated one: not rolled out yet), so the next watch event is no new progress
            observed = {p: observe_deployment(d) for p, d in self.observed_pools(key).items()}
        status = pass_status(key[1], meta.get("generation"), plan, previous, observed, applied, now)
        if plan.problems and status_changed(persisted, status):
            await self.kube.event(
                body, plan.problem_reason, problems_text(plan.problems), "Warning"
            )
        for message in fit_refusals(persisted, status):  # spec.fit: a product gets no pool
            await self.kube.event(body, REASON_PRODUCT_DOES_NOT_FIT, message, "Warning")
        await self._write_status(key, persisted, status)
        if applied.error:
            # the caller retries (reconcile_or_retry): the API server may be briefly away
            raise TransientReconcileError(applied.error)


class TransientReconcileError(RuntimeError):
    """The API server refused or failed a write; retried by the caller."""


__all__ = ["Key", "Reconciler", "TransientReconcileError", "product_of", "resource_version"]
