"""Brings one MTPInference's pools in line with its spec and the cluster's GPU nodes.

Reads come from in-memory views of the cluster (kopf indexes, see app/handlers.py), so a
reconcile that finds nothing to do makes no API request at all; writes go through kube.Kube.
Each resource is reconciled by one task at a time; a request that arrives while one runs
makes it run once more, never twice in parallel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError

from mtp_operator import builders
from mtp_operator.adapters.telemetry import OPERATOR_METRICS
from mtp_operator.api.tuning import PoolTuningStatus
from mtp_operator.api.v1alpha1 import MTPInferenceSpec, MTPInferenceStatus
from mtp_operator.control.pool_writes import BULK_WRITES_IN_FLIGHT, PoolWrites
from mtp_operator.control.ports import ClusterView, Key, Kube, TransportError
from mtp_operator.drift import annotations_read
from mtp_operator.events import REASON_PRODUCT_DOES_NOT_FIT, fit_refusals
from mtp_operator.model_cache import cache_problems, effective
from mtp_operator.planning import NodeInventory, PoolPlan
from mtp_operator.reconcile_plan import (
    Applied,
    pass_status,
    plan_pass,
    pool_inputs,
    product_of,
    resource_version,
    significant,
)
from mtp_operator.rollback.policy import Decision
from mtp_operator.rollback.state import with_decisions
from mtp_operator.settings import OperatorSettings
from mtp_operator.status import (
    bad_times,
    observe_deployment,
    read_status,
    status_changed,
    to_wire,
)
from mtp_operator.tuning.state import with_tuning
from mtp_operator.validation import Problem, problems_text, spec_problems

log = logging.getLogger(__name__)

def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dirty: bool = False
    # traffic classes: the routing objects applied, (kind, name) → their JSON (pool_writes)
    routing: dict[tuple[str, str], str] = field(default_factory=dict)
    routing_set: Any = None  # the DesiredSet whose routing objects were all applied
    # Our own last status write, used until the watch delivers it (never read stale state).
    status: MTPInferenceStatus | None = None
    status_rv: int = 0
    # Pools we applied, by GPU product, until the watch delivers them: a pass that runs before
    # a new Deployment's watch event must not create (and announce) it a second time.
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)
    service_applied: float = -1e9  # monotonic time of our last Service apply
    service_seen: bool = False  # the watch has shown the Service since that apply
    status_written: float = -1e9  # monotonic time of our last status write
    later: asyncio.TimerHandle | None = None  # a pass scheduled by reconcile_later()
    # The last pass's pure results, reused while their inputs are the same: most passes at
    # scale are for a pool's status change and find the same spec and the same plans.
    spec_memo: tuple[str, Any, Any] | None = None  # (spec as JSON, spec, problems)
    desired_memo: builders.DesiredSet | None = None  # the objects, rendered when needed
    last_error: str | None = None  # the last unexpected error (its traceback is logged once)
    canaries: dict[str, Any] = field(default_factory=dict)  # pod name → pool_writes.CanaryMemo
    # per GPU product, the pool Deployment the last pass saw: (resourceVersion, pool_inputs).
    # A watch event with the same version, or the same inputs, brings nothing new (at
    # start-up every pool's ADDED event would be a pass each)
    seen_pools: dict[str, tuple[int, tuple[Any, ...]]] = field(default_factory=dict)
    # the watched body's status object and its typed reading: the evaluator and the tuner ask
    # for every resource's status each round, and a watch event brings a new object each
    # time (the models are frozen, so the reading can be shared)
    read_memo: tuple[Any, MTPInferenceStatus] | None = None
    # per GPU product: (desired objects, observed spec, drift.annotations_read of the observed
    # pool, drifted fields)
    drift_memo: dict[str, tuple[Any, Any, Any, list[str]]] = field(default_factory=dict)
    # what the last pass read of the resource and of the GPU nodes (Reconciler.nodes_seen):
    # at start-up every resource's listed event and the first node event would each make a
    # pass of every resource (2,000 passes for 1,000 resources), the second with nothing new
    seen_resource_rv: int = -1
    seen_nodes_version: int = -1


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


class Reconciler(PoolWrites):
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
        self._slots: dict[Key, _Slot] = {}
        self._tasks: set[asyncio.Task] = set()
        self._gpu_fingerprint: frozenset = frozenset()
        self._progressing: set[Key] = set()  # resources whose last status written says so
        # the GPU nodes the last pass read and a number that changes whenever they differ
        self._nodes: list[Any] = []
        self._nodes_version = 0
        self._inventory = NodeInventory(())
        self._bulk_writes = asyncio.Semaphore(BULK_WRITES_IN_FLIGHT)

    def progress_interval(self) -> float:
        """Seconds between two progress-only status writes of one resource."""
        return max(STATUS_COUNTS_INTERVAL, len(self._progressing) / PROGRESS_WRITES_PER_SECOND)

    # ---- scheduling -------------------------------------------------------------------
    def slot(self, key: Key) -> _Slot:
        slot = self._slots.get(key)  # looked up first: a _Slot (and its lock) costs a build
        if slot is None:
            slot = self._slots[key] = _Slot()
        return slot

    def forget(self, key: Key) -> None:
        slot = self._slots.pop(key, None)
        self._progressing.discard(key)
        if slot is not None and slot.later is not None:
            slot.later.cancel()

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
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if slot.later is not None and not slot.later.cancelled():
            if slot.later.when() <= due:
                return
            slot.later.cancel()

        def fire() -> None:
            slot.later = None
            if self._slots.get(key) is slot:
                task = loop.create_task(self.reconcile_or_retry(key))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

        slot.later = loop.call_at(due, fire)

    async def reconcile_or_retry(self, key: Key) -> None:
        """reconcile(), and on an API error another pass in RETRY_SECONDS: the failure is in
        status where it could be written, and a watch event is not delivered twice."""
        try:
            await self.reconcile(key)
        except (TransientReconcileError, ApiError, TransportError) as err:
            log.warning("will retry %s/%s in %.0fs: %s", key[0], key[1], RETRY_SECONDS, err)
            self.reconcile_later(key, RETRY_SECONDS)
        except Exception as err:  # a bug must not stop this resource for good, nor flood logs
            slot = self.slot(key)
            text = f"{type(err).__name__}: {err}"
            log.error("reconcile %s/%s failed: %s; retrying in %.0fs", key[0], key[1], text,
                      UNEXPECTED_RETRY_SECONDS, exc_info=err if slot.last_error != text else None)
            slot.last_error = text
            self.reconcile_later(key, UNEXPECTED_RETRY_SECONDS)

    def pool_seen(self, key: Key, body: Mapping[str, Any]) -> None:
        """The watch delivered a pool Deployment event (deletions too): our copy is stale now."""
        slot = self._slots.get(key)
        product = product_of(body) or ""
        ours = slot.pools.get(product) if slot else None
        if ours is not None and resource_version(body) >= resource_version(ours):
            self._forget_our_pool(slot, product)

    def pool_news(self, key: Key, body: Mapping[str, Any]) -> bool:
        """Whether a pool Deployment's watch event shows what the last pass did not see.
        When it shows nothing new, what the last pass read (and compared for drift) is
        taken from this copy from now on, the one the watch's index keeps: an older equal
        copy of the pool's spec (~6 KB) is then no longer held beside it until a pass comes."""
        slot = self._slots.get(key)
        if slot is None:
            return True
        product = product_of(body) or ""
        seen = slot.seen_pools.get(product)
        if seen is None:
            return True
        version = resource_version(body)
        if version <= seen[0]:
            return False
        inputs = pool_inputs(body, observe_deployment(body))
        if inputs != seen[1]:
            return True
        slot.seen_pools[product] = (version, inputs)
        spec, annotations = inputs[1], annotations_read(body)
        memo = slot.drift_memo.get(product)
        if memo is not None and memo[1] == spec and memo[2] == annotations:
            slot.drift_memo[product] = (memo[0], spec, annotations, memo[3])
        return False

    def own_status_echo(self, key: Key, body: Mapping[str, Any]) -> bool:
        """Whether a watch event of the resource is our own last status write coming back:
        the object the write returned, which that pass planned with (a change by anyone
        else, spec or metadata, has another resourceVersion). In a rollout about one pass in
        six was one of these (~2.1 status writes a resource, ~11 passes), with nothing to do."""
        slot = self._slots.get(key)
        return slot is not None and slot.status_rv > 0 and resource_version(body) == slot.status_rv

    def observed_pools(self, key: Key) -> dict[str, Mapping[str, Any]]:
        """The watched pool Deployments, with our own newer writes the watch hasn't shown."""
        out = dict(self.view.pool_deployments(key))
        slot = self.slot(key)
        for product, ours in list(slot.pools.items()):
            theirs = out.get(product)
            if theirs is not None and resource_version(theirs) >= resource_version(ours):
                self._forget_our_pool(slot, product)
            else:
                out[product] = ours
        return out

    async def reconcile(self, key: Key) -> None:
        """Reconcile `key`; if one is running, make it run once more and return."""
        slot = self.slot(key)
        if slot.lock.locked():
            slot.dirty = True
            return
        async with slot.lock:
            while True:
                slot.dirty = False
                await self.reconcile_locked(key)
                if not slot.dirty:
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
        return slot is None or resource_version(body) != slot.seen_resource_rv

    async def reconcile_for_nodes(self) -> None:
        """Reconcile every resource whose last pass read other GPU nodes than the view has
        now (after a change of the GPU inventory; the others planned with these nodes).
        A resource with no pass yet is left to its own watch event, which always passes it:
        at start-up the first node event comes amid the listed resources' events, and a pass
        started for both would run twice (a pass asked for while one runs runs again)."""
        _, version = self.nodes_seen()
        keys = [
            k for k in self.view.resource_keys()
            if (slot := self._slots.get(k)) is not None and slot.seen_nodes_version != version
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
    def current_status(self, key: Key, body: Mapping[str, Any]) -> MTPInferenceStatus:
        """The freshest status we know: the watched body's, or our own newer write."""
        slot = self.slot(key)
        if slot.status is not None and slot.status_rv > resource_version(body):
            return slot.status
        raw = body.get("status")
        memo = slot.read_memo
        if memo is None or memo[0] is not raw:
            memo = (raw, read_status(raw))
            slot.read_memo = memo
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
        slot = self.slot(key)
        wait = slot.status_written + self.progress_interval() - time.monotonic()
        if wait > 0 and significant(old) == significant(new):
            self.reconcile_later(key, wait)  # progress only: written with the next change
            return
        out = await self.kube.patch_status(key[0], key[1], to_wire(new))
        slot.status_written = time.monotonic()
        if new.phase == "Progressing":
            self._progressing.add(key)
        else:
            self._progressing.discard(key)
        slot.status = read_status(out.get("status")) if out.get("status") else new
        try:
            slot.status_rv = int(out["metadata"]["resourceVersion"])
        except (KeyError, ValueError, TypeError):
            slot.status_rv = 0
        OPERATOR_METRICS.status_writes.inc()

    async def reconcile_locked(
        self,
        key: Key,
        decisions: Sequence[Decision] = (),
        tuning: Mapping[str, PoolTuningStatus] | None = None,
    ) -> None:
        """One reconcile pass; the caller holds `self.slot(key).lock`. `decisions` (rollback
        decisions, from control/rollback.py) and `tuning` (the tuner's new per-pool entries,
        control/tuner.py) are folded into the status first, so this pass plans with them and
        its one status write persists them."""
        body = self.view.resource(key)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return  # deleted: owner references let the garbage collector remove the pools
        try:
            await self._pass(key, body, decisions, tuning or {})
        finally:
            # counted when done, so a pass that shows in the counter has made its writes
            OPERATOR_METRICS.reconciles.inc()

    async def _pass(
        self, key: Key, body: Mapping[str, Any], decisions: Sequence[Decision],
        tuning: Mapping[str, PoolTuningStatus],
    ) -> None:
        meta = body.get("metadata") or {}
        slot = self.slot(key)
        nodes, slot.seen_nodes_version = self.nodes_seen()
        slot.seen_resource_rv = resource_version(body)
        persisted = self.current_status(key, body)
        previous = with_tuning(with_decisions(persisted, decisions), tuning)
        observed_bodies = self.observed_pools(key)
        observed = {p: observe_deployment(d) for p, d in observed_bodies.items()}
        slot.seen_pools = {
            p: (resource_version(d), pool_inputs(d, observed[p]))
            for p, d in observed_bodies.items()
        }
        now = self.clock()
        spec, problems = self._spec(key, body)
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
            desired = self._desired(
                key, meta.get("uid", ""), plan.spec, plan.pools, frozenset(plan.canaries)
            )
            rolled = frozenset(d.state.gpu_product for d in decisions if d.record is not None)
            try:
                applied = await self.apply(
                    key, body, desired, plan, observed_bodies, previous, announced=rolled
                )
            finally:
                desired.release()  # not held between passes (builders.DesiredSet)
        elif plan.fates:  # nothing fits, but pools of products gone for good still go
            applied = Applied(removed=await self._remove_pools(key, body, observed_bodies, plan))
        if applied.settings_hashes and self.slot(key).pools:
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

    def _spec(
        self, key: Key, body: Mapping[str, Any]
    ) -> tuple[MTPInferenceSpec | None, list[Problem]]:
        """spec_problems(spec), reused while the spec is the same."""
        slot = self.slot(key)
        text = json.dumps(body.get("spec") or {}, sort_keys=True, default=str)
        if slot.spec_memo is None or slot.spec_memo[0] != text:
            spec, problems = spec_problems(body.get("spec") or {})
            slot.spec_memo = (text, spec, problems)
        return slot.spec_memo[1], list(slot.spec_memo[2] or [])

    def _desired(
        self, key: Key, uid: str, spec: MTPInferenceSpec, plans: list[PoolPlan],
        canaries: frozenset[str] = frozenset(),
    ) -> builders.DesiredSet:
        """builders.desired_objects (pure) as a DesiredSet, the same one while its inputs are
        the same. The spec and each pool's K determine a plan's serve settings; the objects
        are never mutated."""
        slot = self.slot(key)
        assert slot.spec_memo is not None
        inputs = (
            slot.spec_memo[0],
            uid,
            tuple((p.key, p.k, p.source, p.k_mode, p.serve) for p in plans),
            canaries,
        )
        if slot.desired_memo is None or slot.desired_memo.inputs != inputs:
            slot.desired_memo = builders.DesiredSet(
                inputs,
                key[1],
                key[0],
                uid,
                spec,
                plans,
                self.settings.default_image,
                self.settings.gpu_profiles,
                effective(spec, self.settings.model_cache, key[0]),
                canaries,
            )
        return slot.desired_memo

class TransientReconcileError(RuntimeError):
    """The API server refused or failed a write; retried by the caller."""


__all__ = ["Key", "Reconciler", "TransientReconcileError", "product_of", "resource_version"]
