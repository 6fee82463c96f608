"""The pool objects of a pass (`PoolWrites`, held by `control.writes.Writes`): each pool
Deployment or LeaderWorkerSet that drifted, written at once with its rollout strategy and
PodDisruptionBudget; a pool renamed or changed in kind made anew and its old object deleted.
Written against the Kube port; what was written is kept in the resource's slot
(`control.slots.Ours.pools`) until the watch shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from lightkube import ApiError

from mtp_operator import builders, rollout
from mtp_operator.adapters.telemetry import OPERATOR_METRICS
from mtp_operator.control.ports import ClusterView, Key, Kube, TransportError
from mtp_operator.control.slots import Slot
from mtp_operator.drift import annotations_read, drifted_fields
from mtp_operator.events import (
    REASON_MANUAL_CHANGE_REVERTED,
    REASON_POOL_CREATED,
    REASON_POOL_REMOVED,
    REASON_POOL_UPDATED,
    manual_change_reverted,
    pool_created,
    pool_messages,
    pool_removed,
    pool_updated,
)
from mtp_operator.lws import group_size, is_leaderworkerset, pods_shape
from mtp_operator.naming import ANNOTATION_GPU_PRODUCT, ANNOTATION_SETTINGS_HASH
from mtp_operator.planning import PoolPlan
from mtp_operator.reconcile_plan import PassPlan, product_of, resource_version

log = logging.getLogger(__name__)




# At most this many Deployment and Service writes of ordinary passes in flight at once. A
# rollout of N resources asks for 5N writes within seconds; sent at once, each held its
# request and response objects (lightkube's model, the JSON both ways: ~40 KB) until the API
# server, which works through them at its own pace anyway, answered: at 250 resources a
# transient of ~45 MiB of the operator's 80 (tracemalloc), its peak. The writes of a pass
# that rolls a pool back do not wait here.
BULK_WRITES_IN_FLIGHT = 32



class PoolWrites:
    """The writes of a pass's pool objects; what they keep lives in the resource's slot and,
    for every resource, in the PodDisruptionBudgets written and the products' room."""

    def __init__(self, kube: Kube, view: ClusterView, slot: Callable[[Key], Slot]) -> None:
        self.kube = kube
        self.view = view
        self.slot = slot
        # at most BULK_WRITES_IN_FLIGHT ordinary writes at once (in_turn)
        self.bulk_writes = asyncio.Semaphore(BULK_WRITES_IN_FLIGHT)
        # (namespace, name) of a pool → the minAvailable its PodDisruptionBudget was written with
        self.budgets: dict[tuple[str, str], int] = {}
        # product → (when gathered, the watched pools there: (name, pods_shape)); _product_room
        self.rooms: dict[str, tuple[float, list[tuple[tuple[str, str], Any]]]] = {}

    def in_turn(self, urgent: bool = False) -> Any:
        """The turn a write waits for (none for an urgent one)."""
        return contextlib.nullcontext() if urgent else self.bulk_writes

    async def apply_pools(
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
            await self.delete_pool(meta.get("namespace", ""), old)
            await self.kube.event(owner, REASON_POOL_REMOVED, pool_removed(
                product_of(obj) or "?", f"{old_kind} {old_name} deleted: {why}"))

    async def delete_pool(self, namespace: str, pool: Mapping[str, Any]) -> None:
        """Delete a pool's object, a Deployment or a LeaderWorkerSet (its groups' pods and
        StatefulSets go with it: the LWS controller owns them)."""
        name = (pool.get("metadata") or {}).get("name", "")
        if is_leaderworkerset(pool):
            await self.kube.delete_leaderworkerset(namespace, name)
            return
        await self.kube.delete_deployment(namespace, name)
        # its PodDisruptionBudget (same name) selects no pod now: gone with it, not left until
        # the resource is deleted (an install whose RBAC predates this may refuse: logged)
        self.budgets.pop((namespace, name), None)
        try:
            await self.kube.delete_pdb(namespace, name)
        except ApiError as err:
            log.warning("PodDisruptionBudget %s/%s not deleted: %s", namespace, name, err)

    async def _write_pool(
        self,
        owner: Mapping[str, Any],
        plan: PoolPlan,
        desired: Mapping[str, Any],
        replace_rv: str | None = None,
        urgent: bool = False,
        budget: Mapping[str, Any] | None = None,
    ) -> None:
        async with self.in_turn(urgent):
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
                    self.budgets.pop((meta["namespace"], meta["name"]), None)
                    log.warning("PodDisruptionBudget %s/%s not written: %s", meta["namespace"],
                                meta["name"], err)
        OPERATOR_METRICS.deployment_writes.inc()
        if resource_version(out):
            self._owner_slot(owner).ours.pools[plan.key] = out

    def _product_room(self, product: str, writing: Mapping[str, Any]) -> rollout.ProductRoom:
        """`product`'s GPUs and what the operator's pools of every resource request there, with
        the pool being written (`writing`) counted at its desired size, not the watched one: a
        scale and a change of K folded into one write must not find the old size's room. The
        watched pools are gathered again at most once a second (a rollout of every pool asks)."""
        rooms = self.rooms
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
        budgets = self.budgets
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

    def _owner_slot(self, owner: Mapping[str, Any]) -> Slot:
        """The slot of the resource `owner` (its body) is."""
        meta = owner.get("metadata") or {}
        return self.slot((meta.get("namespace", ""), meta.get("name", "")))

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
        memos = self._owner_slot(owner).memos.drift
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
