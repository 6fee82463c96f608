"""The reconciler's I/O step (`Reconciler.apply`): the Service, each pool Deployment that
drifted, the tuning canaries, the pools whose fate is removal, and the retained pools' status
entries. Written against the Kube port; mixed into `control.reconciler.Reconciler`, whose
per-resource slots remember what was applied until the watch shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lightkube import ApiError

from mtp_operator import builders, rollout
from mtp_operator.adapters.telemetry import OPERATOR_METRICS
from mtp_operator.api.v1alpha1 import MTPInferenceStatus, PoolStatus
from mtp_operator.control.ports import Key, TransportError
from mtp_operator.drift import annotations_read, drifted_fields
from mtp_operator.events import (
    REASON_MANUAL_CHANGE_REVERTED,
    REASON_POOL_CREATED,
    REASON_POOL_REMOVED,
    REASON_POOL_RETAINED,
    REASON_POOL_UPDATED,
    REASON_TUNING_CANARY_DELETED,
    manual_change_reverted,
    pool_created,
    pool_messages,
    pool_removed,
    pool_retained,
    pool_updated,
)
from mtp_operator.lws import group_size, is_leaderworkerset, pods_shape
from mtp_operator.model_cache import effective
from mtp_operator.naming import (
    ANNOTATION_GPU_PRODUCT,
    ANNOTATION_SETTINGS_HASH,
    LABEL_OWNER_UID,
    class_service_name,
    inference_pool_name,
    owner_label_rolled_out,
    picker_config_name,
)
from mtp_operator.planning import PoolPlan
from mtp_operator.reconcile_plan import Applied, PassPlan, product_of, resource_version
from mtp_operator.status import observe_deployment, retained_entry
from mtp_operator.timestamps import format_time
from mtp_operator.tuning.state import canary_unwanted

if TYPE_CHECKING:
    from datetime import datetime

    from mtp_operator.control.ports import ClusterView, Kube
    from mtp_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

# Our Service apply stands in for the watch's copy until the watch shows it (then its absence
# means someone deleted it) or, should the watch never show it, this many seconds. Under a
# large rollout the watch can take over a minute to deliver it.
SERVICE_WATCH_GRACE = 300.0
# A canary pod this operator made stands in for the watch's copy until the watch shows it
# (Running) or, should it not, this many seconds: then it is applied again (no change if it
# is there, made again if it was deleted before it ran). A canary it deleted is not deleted
# again for as long, while the watch may still show it.
CANARY_WATCH_GRACE = 120.0


@dataclass
class CanaryMemo:
    """A canary pod as the reconciler knows it (slot.canaries, by pod name)."""

    product: str | None
    settings_hash: str | None
    applied_at: float  # monotonic: when made, or first shown by the watch
    seen: bool = False  # the watch has shown it
    deleted_at: float | None = None  # monotonic: when this operator deleted it


# At most this many Deployment and Service writes of ordinary passes in flight at once. A
# rollout of N resources asks for 5N writes within seconds; sent at once, each held its
# request and response objects (lightkube's model, the JSON both ways: ~40 KB) until the API
# server, which works through them at its own pace anyway, answered: at 250 resources a
# transient of ~45 MiB of the operator's 80 (tracemalloc), its peak. The writes of a pass
# that rolls a pool back do not wait here.
BULK_WRITES_IN_FLIGHT = 32


class PoolWrites:
    """The writes of one pass; the state they keep lives in the reconciler's slots."""

    kube: Kube
    view: ClusterView
    settings: OperatorSettings
    _bulk_writes: asyncio.Semaphore  # BULK_WRITES_IN_FLIGHT, made by the reconciler

    def _in_turn(self, urgent: bool = False) -> Any:
        """The slot a write waits for (none for an urgent one)."""
        return contextlib.nullcontext() if urgent else self._bulk_writes

    if TYPE_CHECKING:
        def slot(self, key: Key) -> Any: ...
        def clock(self) -> datetime: ...
        def reconcile_later(self, key: Key, delay: float) -> None: ...

    async def apply(
        self,
        key: Key,
        body: Mapping[str, Any],
        desired: builders.DesiredSet,
        plan: PassPlan,
        observed_bodies: Mapping[str, Mapping[str, Any]],
        previous: MTPInferenceStatus | None = None,
        announced: frozenset[str] = frozenset(),
    ) -> Applied:
        """The I/O step: the Service if missing, each pool that drifted, the pools whose fate
        is removal; retained pools are left as they run (reported, see _retained). Pools in
        `announced` (rolled back in this pass: their SpeculationRolledBack Event says why)
        get no PoolUpdated Event besides."""
        hashes: dict[str, str] = {}
        try:
            await self._apply_service(key, body, desired, observed_bodies)
            for digest, pool in zip(desired.hashes, plan.pools, strict=True):
                hashes[pool.key] = digest
            await self._apply_pools(body, desired, plan, observed_bodies, announced)
            await self._apply_routing(key, desired, plan)
            await self._apply_canaries(key, body, plan)
            removed = await self._remove_pools(key, body, observed_bodies, plan)
            await self._remove_routing(key, body, plan)
            retained = await self._retained(key, body, previous, observed_bodies, plan)
        except (ApiError, TransportError) as err:
            if isinstance(err, ApiError):
                error = f"{err.status.code}: {err.status.message}"
            else:
                error = f"API server unreachable: {type(err).__name__} {err}".strip()
            log.warning("reconcile %s/%s failed: %s", key[0], key[1], error)
            return Applied(hashes, [], error)
        return Applied(hashes, removed, retained=retained)

    async def _apply_service(
        self,
        key: Key,
        body: Mapping[str, Any],
        desired: builders.DesiredSet,
        observed: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """The resource's Service: made when missing; it selects by the owner's UID label as
        soon as no pod of the resource can lack it (naming.owner_label_rolled_out), before
        that by the resource label alone, and once it does it never goes back (issue 36)."""
        slot = self.slot(key)
        since = time.monotonic() - slot.service_applied
        selector = self.view.service_selector(key)
        if selector is not None and LABEL_OWNER_UID in selector:
            slot.service_seen = True
            return
        if selector is None and not (slot.service_seen or since > SERVICE_WATCH_GRACE):
            return  # our apply stands in for the watch's copy for now
        uid = (body.get("metadata") or {}).get("uid") or ""
        tighten = owner_label_rolled_out(
            observed.values(), self.view.canary_pods(key).values(), uid
        )
        if selector is not None:
            slot.service_seen = True
            if not tighten or since <= SERVICE_WATCH_GRACE:
                return  # nothing to change, or our tightening not shown yet
        svc = desired.objects()[0]
        async with self._in_turn():
            await self.kube.apply(svc if tighten else builders.label_only_service(svc))
        slot.service_applied = time.monotonic()
        slot.service_seen = selector is not None

    async def _apply_routing(self, key: Key, desired: builders.DesiredSet, plan: PassPlan) -> None:
        """The routing objects of a resource with traffic classes (mtp_operator.routing, after
        the pools in the desired objects), applied when they differ from what this operator
        last applied (they are not watched: one edited by hand is set back at the next
        change or restart). Without the InferencePool CRD its apply is a 404: logged and
        tried again next pass, the pools and class Services still serve. A pass whose
        desired set is the one last applied in full renders nothing."""
        slot = self.slot(key)
        if plan.spec is None or not plan.spec.speculative.classes or slot.routing_set is desired:
            return
        extras = desired.objects()[1 + len(plan.pools):]
        memo = slot.routing
        complete = True
        for obj in extras:
            ident = (obj["kind"], obj["metadata"]["name"])
            text = json.dumps(obj, sort_keys=True)
            if memo.get(ident) == text:
                continue
            try:
                async with self._in_turn():
                    await self.kube.apply(obj)
            except ApiError as err:
                if obj["kind"] != "InferencePool" or err.status.code != 404:
                    raise
                log.warning("%s/%s: InferencePool not applied (is the Gateway API Inference "
                            "Extension CRD installed?): %s", key[0], key[1], err.status.message)
                complete = False
                continue
            memo[ident] = text
        slot.routing_set = desired if complete else None

    async def _remove_routing(
        self, key: Key, body: Mapping[str, Any], plan: PassPlan
    ) -> None:
        """Delete the routing objects the spec no longer plans (issue 39): the Service of a
        class taken out of the list and, once the spec has no classes, the InferencePool and
        the picker's ConfigMap. Which exist: the class Services the watch shows and what this
        process applied (the InferencePool and ConfigMap are not watched: with no classes
        left they are looked for while a class Service still shows, so they go first and a
        failed delete is tried again next pass). Only objects whose controller is this
        resource (by UID) are deleted. Nothing to delete, no request."""
        if plan.spec is None:
            return  # an invalid spec plans nothing; delete nothing on its account
        name = key[1]
        classes = [c.name for c in plan.spec.speculative.classes or ()]
        wanted = {("Service", class_service_name(name, c)) for c in classes}
        if classes:
            wanted |= {("InferencePool", inference_pool_name(name)),
                       ("ConfigMap", picker_config_name(name))}
        slot = self.slot(key)
        seen = {("Service", n) for n in self.view.class_services(key)}
        stale = (seen | set(slot.routing)) - wanted
        if not stale:
            return
        if not classes:
            stale |= {("InferencePool", inference_pool_name(name)),
                      ("ConfigMap", picker_config_name(name))}
        uid = (body.get("metadata") or {}).get("uid") or ""
        order = {"InferencePool": 0, "ConfigMap": 1, "Service": 2}
        for kind, obj_name in sorted(stale, key=lambda i: (order[i[0]], i[1])):
            async with self._in_turn():
                deleted = await self.kube.delete_owned(kind, key[0], obj_name, uid)
            slot.routing.pop((kind, obj_name), None)
            if deleted:
                log.info("%s/%s: %s %s deleted: no class of the spec routes through it",
                         key[0], name, kind, obj_name)

    async def _remove_pools(
        self,
        key: Key,
        body: Mapping[str, Any],
        observed: Mapping[str, Mapping[str, Any]],
        plan: PassPlan,
    ) -> list[str]:
        """Delete the pools whose fate is removal; returns their GPU products."""
        removed = []
        for fate in plan.fates:
            if fate.action != "remove" or fate.key not in observed:
                continue
            dep = observed[fate.key]
            await self._delete_pool(key[0], dep)
            self.slot(key).pools.pop(fate.key, None)
            self.slot(key).drift_memo.pop(fate.key, None)
            removed.append(fate.key)
            await self.kube.event(
                body, REASON_POOL_REMOVED, pool_removed(fate.key, fate.message)
            )
        return removed

    async def _delete_pool(self, namespace: str, pool: Mapping[str, Any]) -> None:
        """Delete a pool's object, a Deployment or a LeaderWorkerSet (its groups' pods and
        StatefulSets go with it: the LWS controller owns them)."""
        name = (pool.get("metadata") or {}).get("name", "")
        if is_leaderworkerset(pool):
            await self.kube.delete_leaderworkerset(namespace, name)
            return
        await self.kube.delete_deployment(namespace, name)
        # its PodDisruptionBudget (same name) selects no pod now: gone with it, not left until
        # the resource is deleted (an install whose RBAC predates this may refuse: logged)
        self.__dict__.get("_pool_budgets", {}).pop((namespace, name), None)
        try:
            await self.kube.delete_pdb(namespace, name)
        except ApiError as err:
            log.warning("PodDisruptionBudget %s/%s not deleted: %s", namespace, name, err)

    async def _retained(
        self,
        key: Key,
        body: Mapping[str, Any],
        previous: MTPInferenceStatus | None,
        observed: Mapping[str, Mapping[str, Any]],
        plan: PassPlan,
    ) -> list[tuple[PoolStatus, str]]:
        """Status entries of the pools kept as they run; an Event when one starts being kept,
        and a pass at the earliest removal deadline."""
        before = {p.key: p for p in (previous.pools if previous else [])}
        out = []
        for fate in plan.fates:
            if fate.action != "retain" or fate.key not in observed:
                continue
            dep = observed[fate.key]
            prev = before.get(fate.key)
            since = format_time(fate.gone_since) if fate.gone_since else None
            entry = retained_entry(key[1], prev, dep, observe_deployment(dep), fate.reason, since)
            if (prev.retained if prev else None) != fate.reason:
                await self.kube.event(
                    body,
                    REASON_POOL_RETAINED,
                    pool_retained(fate.key, fate.message),
                    "Warning",
                )
            if fate.remove_at is not None:
                delay = (fate.remove_at - self.clock()).total_seconds()
                self.reconcile_later(key, max(delay, 0.0) + 0.5)
            out.append((entry, fate.message))
        return out

    async def _apply_canaries(self, key: Key, body: Mapping[str, Any], plan: PassPlan) -> None:
        """A canary exists only while a live trial names it (issue 36). The canary pods the
        watch shows (Running ones) and the ones this operator made and the watch has not
        shown yet are compared with the plan's, by name and pod template (settings hash):
        one the plan does not want is deleted, with an Event saying why; one whose template
        changed is deleted too (a pod's spec cannot be changed: a patch is a 422) and made
        again from the new template once the watch shows it gone; a wanted one is made when
        missing: never made yet, deleted by hand (the watch showed it, and does no more),
        or made CANARY_WATCH_GRACE ago and still not shown (applying it again changes
        nothing if it is there)."""
        slot = self.slot(key)
        spec = plan.spec
        assert spec is not None
        uid = (body.get("metadata") or {}).get("uid", "")
        wanted: dict[str, tuple[str, dict[str, Any]]] = {}  # pod name → (product, pod)
        for product, cplan in plan.canaries.items():
            pod = builders.canary_pod(key[1], key[0], uid, spec, cplan,
                                      self.settings.default_image, self.settings.gpu_profiles,
                                      effective(spec, self.settings.model_cache, key[0]))
            wanted[pod["metadata"]["name"]] = (product, pod)
        now = time.monotonic()
        memo: dict[str, CanaryMemo] = slot.canaries
        shown = {
            name: meta for name, meta in self.view.canary_pods(key).items()
            if not meta.get("deletionTimestamp")  # already going: neither kept nor deleted
        }
        for name, meta in shown.items():
            annotations = meta.get("annotations") or {}
            known = memo.get(name)
            if known is None or known.settings_hash != annotations.get(ANNOTATION_SETTINGS_HASH):
                memo[name] = CanaryMemo(product_of({"metadata": meta}),  # its pool key
                                        annotations.get(ANNOTATION_SETTINGS_HASH), now)
            memo[name].seen = True
        for name in list(memo):
            known = memo[name]
            if name not in shown and known.seen:
                del memo[name]  # it went away (deleted by hand, or ended): made again below
                continue
            if known.deleted_at is not None:
                if now - known.deleted_at < CANARY_WATCH_GRACE:
                    continue  # our delete is under way
                known.deleted_at = None
            want = wanted.get(name)
            if want is None:
                pinned = (known.product is not None
                          and plan.rollback.k_for(known.product) is not None)
                why = canary_unwanted(spec, plan.tuning, known.product, pinned)
            elif known.settings_hash != want[1]["metadata"]["annotations"].get(
                    ANNOTATION_SETTINGS_HASH):
                why = ("its pod template changed and a pod's spec cannot be changed: made "
                       "again from the new template once gone")
            else:
                continue
            await self.kube.delete_pod(key[0], name)
            known.deleted_at = now
            await self.kube.event(
                body, REASON_TUNING_CANARY_DELETED,
                f"pool {known.product or '?'}: canary pod {name} deleted: {why}", "Normal",
            )
        for name, (product, pod) in wanted.items():
            known = memo.get(name)
            if known is not None and (known.seen or known.deleted_at is not None
                                      or now - known.applied_at < CANARY_WATCH_GRACE):
                continue
            await self.kube.apply(pod)
            memo[name] = CanaryMemo(product, pod["metadata"]["annotations"][
                ANNOTATION_SETTINGS_HASH], now)

    async def _write_pool(
        self,
        owner: Mapping[str, Any],
        plan: PoolPlan,
        desired: Mapping[str, Any],
        replace_rv: str | None = None,
        urgent: bool = False,
        budget: Mapping[str, Any] | None = None,
    ) -> None:
        async with self._in_turn(urgent):
            if replace_rv is not None:  # someone added fields: only a full replace removes them
                out = await self.kube.replace(desired, replace_rv)
            else:
                out = await self.kube.apply(desired)
            if budget is not None:  # the pool's PodDisruptionBudget (rollout.min_available)
                try:
                    await self.kube.apply(budget)
                except (ApiError, TransportError) as err:
                    # never fails the pool's write (a rollback must not wait on it, and an
                    # install whose RBAC predates budgets gets 403): written again with the
                    # pool's next write
                    meta = budget["metadata"]
                    self.__dict__.get("_pool_budgets", {}).pop(
                        (meta["namespace"], meta["name"]), None)
                    log.warning("PodDisruptionBudget %s/%s not written: %s", meta["namespace"],
                                meta["name"], err)
        OPERATOR_METRICS.deployment_writes.inc()
        if resource_version(out):
            self._owner_slot(owner).pools[plan.key] = out

    def _product_room(self, product: str, writing: Mapping[str, Any]) -> rollout.ProductRoom:
        """`product`'s GPUs and what the operator's pools of every resource request there, with
        the pool being written (`writing`) counted at its desired size, not the watched one: a
        scale and a change of K folded into one write must not find the old size's room. The
        watched pools are gathered again at most once a second (a rollout of every pool asks)."""
        rooms: dict[str, tuple[float, list[tuple[tuple[str, str], Mapping[str, Any]]]]] = (
            self.__dict__.setdefault("_rollout_rooms", {}))
        now = time.monotonic()
        hit = rooms.get(product)
        if hit is None or now - hit[0] >= 1.0:
            watched = [
                (_name_of(dep), pods_shape(dep))  # a LeaderWorkerSet: groups x pods per group
                for key in self.view.resource_keys()
                for dep in self.view.pool_deployments(key).values()
                if ((dep.get("metadata") or {}).get("annotations") or {}).get(
                    ANNOTATION_GPU_PRODUCT) == product
            ]
            hit = (now, watched)
            rooms[product] = hit
        own = _name_of(writing)
        pools = [dep for name, dep in hit[1] if name != own]
        pools.append(pods_shape(writing))
        return rollout.product_room(product, self.view.gpu_nodes(), pools)

    def _rollout_writes(
        self,
        writes: list[tuple[PoolPlan, tuple[Mapping[str, Any], str | None, tuple[str, str, str]]]],
        observed_bodies: Mapping[str, Mapping[str, Any]],
    ) -> tuple[list[tuple[Mapping[str, Any], Mapping[str, Any] | None]], dict[str, str]]:
        """Per write: the Deployment with the strategy of its rollout, and the pool's
        PodDisruptionBudget when this process has not written it with that minAvailable yet
        (once per pool after a start, then when the replicas cross 2); the rollouts' Event
        messages by pool (issue 37, rollout.surge_decision)."""
        out: list[tuple[Mapping[str, Any], Mapping[str, Any] | None]] = []
        notes: dict[str, str] = {}
        budgets: dict[tuple[str, str], int] = self.__dict__.setdefault("_pool_budgets", {})
        for pool, (obj, _rv, _event) in writes:
            if is_leaderworkerset(obj):  # its own rollingUpdateConfiguration: a group at a
                out.append((obj, None))   # time, no surge (a group holds N nodes); no budget
                continue
            observed = observed_bodies.get(pool.key)
            rolls = rollout.rolls_pods(obj, observed, ANNOTATION_SETTINGS_HASH)
            replicas = obj["spec"]["replicas"]
            if rolls:
                decision = rollout.surge_decision(
                    self._product_room(pool.gpu_product, obj), rollout.pod_gpus(obj), replicas,
                    bool(obj["spec"]["template"]["spec"].get("hostNetwork")))
                obj = rollout.with_rolling_update(obj, decision.rolling_update)
                notes[pool.key] = f"pool {pool.key}: {decision.message}"
            elif (kept := rollout.observed_rolling_update(observed)) is not None:
                obj = rollout.with_rolling_update(obj, kept)
            meta = obj["metadata"]
            name = (meta["namespace"], meta["name"])
            wanted = rollout.min_available(replicas)
            if budgets.get(name) == wanted:
                out.append((obj, None))
            else:  # remembered as written (forgotten again if the write fails)
                budgets[name] = wanted
                out.append((obj, builders.pool_disruption_budget(obj)))
        return out, notes

    @staticmethod
    def _forget_our_pool(slot: Any, product: str) -> None:
        """Drop the pool Deployment a write returned (the watch shows it now), and the drift
        memo entry that compared against it: when the watched copy brings no news, no pass
        replaces that entry, and it would keep the returned spec, a second copy of the pool
        (~10 KB), for as long as the pool is unchanged."""
        ours = slot.pools.pop(product)
        memo = slot.drift_memo.get(product)
        if memo is not None and memo[1] is ours.get("spec"):
            del slot.drift_memo[product]

    def _owner_slot(self, owner: Mapping[str, Any]) -> Any:
        """The slot of the resource `owner` (its body) is."""
        meta = owner.get("metadata") or {}
        return self.slot((meta.get("namespace", ""), meta.get("name", "")))

    async def _apply_pools(
        self,
        owner: Mapping[str, Any],
        desired: builders.DesiredSet,
        plan: PassPlan,
        observed_bodies: Mapping[str, Mapping[str, Any]],
        announced: frozenset[str] = frozenset(),
    ) -> None:
        """Every pool that drifted, written at once (the pools of one resource are
        independent: a rollback of three pools waits for one round trip, not three), then
        their Events, so no write waits behind an Event: one per reason, naming its pools
        (events.pool_messages). The first failed write is raised after the Events of the
        others are posted. Which pools drifted is decided first, without waiting: a pass
        with nothing to write never yields to other passes (at a restart all of them would
        otherwise be under way at once, each holding its rendered objects)."""
        writes = [
            (pool, write)
            for i, pool in enumerate(plan.pools)
            if (write := self._pool_write(owner, desired, i, pool,
                                          observed_bodies.get(pool.key))) is not None
        ]
        if not writes:
            return
        objects, rollouts = self._rollout_writes(writes, observed_bodies)
        results = await asyncio.gather(
            *(
                self._write_pool(owner, pool, obj, rv, urgent=pool.key in announced,
                                 budget=budget)
                for (pool, (_obj, rv, _event)), (obj, budget) in zip(writes, objects,
                                                                      strict=True)
            ),
            return_exceptions=True,
        )
        by_reason: dict[tuple[str, str], list[str]] = {}
        for (pool, (_obj, _rv, event)), result in zip(writes, results, strict=True):
            if isinstance(result, BaseException) or (
                event[0] == REASON_POOL_UPDATED and pool.key in announced
            ):
                continue
            reason, message, type_ = event
            by_reason.setdefault((reason, type_), []).append(message)
        for (pool, _write), result in zip(writes, results, strict=True):
            if pool.key in rollouts and not isinstance(result, BaseException):
                by_reason.setdefault((rollout.REASON_POOL_ROLLOUT, "Normal"), []).append(
                    rollouts[pool.key])
        for (reason, type_), messages in by_reason.items():
            for message in pool_messages(messages):
                await self.kube.event(owner, reason, message, type_)
        await self._drop_renamed(owner, [obj for _pool, (obj, _rv, _ev) in writes], results,
                                 observed_bodies)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _drop_renamed(
        self,
        owner: Mapping[str, Any],
        written: list[Mapping[str, Any]],
        results: list[Any],
        observed_bodies: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """Delete the old Deployment of each pool just written under a new name (issue 36:
        it would otherwise run beside the new one, for ever, with the same pool's labels)."""
        meta = owner.get("metadata") or {}
        for obj, result in zip(written, results, strict=True):
            if isinstance(result, BaseException):
                continue
            old = observed_bodies.get(product_of(obj) or "")
            old_name = ((old or {}).get("metadata") or {}).get("name")
            if not old_name or old is None:
                continue
            old_kind = "LeaderWorkerSet" if is_leaderworkerset(old) else "Deployment"
            new_kind = "LeaderWorkerSet" if is_leaderworkerset(obj) else "Deployment"
            if old_name != obj["metadata"]["name"]:
                why = f"the pool's name changed to {obj['metadata']['name']}"
            elif old_kind != new_kind:  # a replica now spans several nodes, or one again
                why = f"the pool is a {new_kind} now ({group_size(obj)} node(s) per replica)"
            else:
                continue
            await self._delete_pool(meta.get("namespace", ""), old)
            await self.kube.event(owner, REASON_POOL_REMOVED, pool_removed(
                product_of(obj) or "?", f"{old_kind} {old_name} deleted: {why}"))

    def _drift(
        self,
        owner: Mapping[str, Any],
        product: str,
        desired: builders.DesiredSet,
        index: int,
        observed: Mapping[str, Any],
    ) -> list[str]:
        """drifted_fields(pool `index` of `desired`, observed), reused while both are the
        same (the same DesiredSet: the same inputs; the observed spec and the annotations
        drift reads, compared whole, not by resourceVersion): most passes of a rollout come
        from a pool's status changing, and the Deployment controller's revision annotation
        leaves what drift reads as it was (re-rendering the pools to compare again cost
        ~1 ms a resource)."""
        memos = self._owner_slot(owner).drift_memo
        spec = observed.get("spec")
        annotations = annotations_read(observed)  # others' annotations are not compared
        memo = memos.get(product)
        if memo is not None and memo[0] is desired and memo[1] == spec and memo[2] == annotations:
            # held from now on by the objects just seen (the watched body, which the index
            # keeps anyway): the memo must not keep an equal older copy, such as the body a
            # write returned, alive beside it (~30 KB a pool)
            memos[product] = (desired, spec, annotations, memo[3])
            return memo[3]
        changed = drifted_fields(desired.objects()[1 + index], observed)
        memos[product] = (desired, spec, annotations, changed)
        return changed

    def _pool_write(
        self,
        owner: Mapping[str, Any],
        desired_set: builders.DesiredSet,
        index: int,
        plan: PoolPlan,
        observed: Mapping[str, Any] | None,
    ) -> tuple[Mapping[str, Any], str | None, tuple[str, str, str]] | None:
        """The write pool `index` of `desired_set` needs, if it drifted: (the object, the
        resourceVersion to replace, or None to apply; the Event (reason, message, type) to
        post once written)."""
        if observed is None:
            desired = desired_set.objects()[1 + index]
            event = REASON_POOL_CREATED, pool_created(plan, desired["metadata"]["name"]), "Normal"
            return desired, None, event
        changed = self._drift(owner, plan.key, desired_set, index, observed)
        if not changed:
            return None
        desired = desired_set.objects()[1 + index]
        old = (observed.get("metadata") or {}).get("name")
        if "name" in changed and old:  # renamed: made under its new name, the old one deleted
            message = f"{pool_created(plan, desired['metadata']['name'])} (replaces {old}: the " \
                      "pool's name changed)"
            return desired, None, (REASON_POOL_CREATED, message, "Normal")
        if "pool kind" in changed and old:  # Deployment <-> LeaderWorkerSet: made anew,
            message = (f"{pool_created(plan, desired['metadata']['name'])} as a "  # old deleted
                       f"{desired['kind']} (replaces the {old} of the other kind)")
            return desired, None, (REASON_POOL_CREATED, message, "Normal")
        ours = desired["metadata"]["annotations"][ANNOTATION_SETTINGS_HASH]
        theirs = (observed.get("metadata") or {}).get("annotations", {}).get(
            ANNOTATION_SETTINGS_HASH
        )
        added = any(c.startswith("added ") for c in changed)
        rv = (observed.get("metadata") or {}).get("resourceVersion") if added else None
        if ours == theirs:
            event = (
                REASON_MANUAL_CHANGE_REVERTED,
                manual_change_reverted(plan.key, changed),
                "Warning",
            )
        else:
            event = REASON_POOL_UPDATED, pool_updated(plan), "Normal"
        return desired, rv, event


def _name_of(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return (meta.get("namespace", ""), meta.get("name", ""))
