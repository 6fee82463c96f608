"""The one writer of a pass's objects (`Writes.apply`, held by the reconciler as
`Reconciler.writes`): the Service, the pool objects that drifted (`control.pool_writes`), the
routing objects of traffic classes, the tuning canaries, the pools whose fate is removal, and
the retained pools' status entries. Written against the Kube port; what it wrote is kept in
the resource's slot (`control.slots.Ours`) until the watch shows it. The status itself is
written by the reconciler (`Reconciler._write_status`), once a pass.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from lightkube import ApiError

from mtp_operator import builders
from mtp_operator.api.v1alpha1 import MTPInferenceStatus, PoolStatus
from mtp_operator.control.pool_writes import PoolWrites
from mtp_operator.control.ports import ClusterView, Key, Kube, TransportError
from mtp_operator.control.slots import CanaryMemo, Slot
from mtp_operator.events import (
    REASON_POOL_REMOVED,
    REASON_POOL_RETAINED,
    REASON_TUNING_CANARY_DELETED,
    pool_removed,
    pool_retained,
)
from mtp_operator.model_cache import effective
from mtp_operator.naming import (
    ANNOTATION_SETTINGS_HASH,
    LABEL_OWNER_UID,
    class_service_name,
    inference_pool_name,
    owner_label_rolled_out,
    picker_config_name,
)
from mtp_operator.reconcile_plan import Applied, PassPlan, product_of
from mtp_operator.settings import OperatorSettings
from mtp_operator.status import observe_deployment, retained_entry
from mtp_operator.timestamps import format_time
from mtp_operator.tuning.state import canary_unwanted

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


class Writes:
    """The writes of one pass; the state they keep lives in the resource's slot."""

    def __init__(
        self,
        kube: Kube,
        view: ClusterView,
        settings: OperatorSettings,
        slot: Callable[[Key], Slot],
        clock: Callable[[], datetime],
        reconcile_later: Callable[[Key, float], None],
    ) -> None:
        self.kube = kube
        self.view = view
        self.settings = settings
        self.slot = slot
        self.clock = clock
        self.reconcile_later = reconcile_later
        self.pools = PoolWrites(kube, view, slot)

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
            await self.pools.apply_pools(body, desired, plan, observed_bodies, announced)
            await self._apply_routing(key, desired, plan)
            await self._apply_canaries(key, body, plan)
            removed = await self.remove_pools(key, body, observed_bodies, plan)
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
        ours = self.slot(key).ours
        since = time.monotonic() - ours.service_applied
        selector = self.view.service_selector(key)
        if selector is not None and LABEL_OWNER_UID in selector:
            ours.service_seen = True
            return
        if selector is None and not (ours.service_seen or since > SERVICE_WATCH_GRACE):
            return  # our apply stands in for the watch's copy for now
        uid = (body.get("metadata") or {}).get("uid") or ""
        tighten = owner_label_rolled_out(
            observed.values(), self.view.canary_pods(key).values(), uid
        )
        if selector is not None:
            ours.service_seen = True
            if not tighten or since <= SERVICE_WATCH_GRACE:
                return  # nothing to change, or our tightening not shown yet
        svc = desired.objects()[0]
        async with self.pools.in_turn():
            await self.kube.apply(svc if tighten else builders.label_only_service(svc))
        ours.service_applied = time.monotonic()
        ours.service_seen = selector is not None

    async def _apply_routing(self, key: Key, desired: builders.DesiredSet, plan: PassPlan) -> None:
        """The routing objects of a resource with traffic classes (mtp_operator.routing, after
        the pools in the desired objects), applied when they differ from what this operator
        last applied (they are not watched: one edited by hand is set back at the next
        change or restart). Without the InferencePool CRD its apply is a 404: logged and
        tried again next pass, the pools and class Services still serve. A pass whose
        desired set is the one last applied in full renders nothing."""
        ours = self.slot(key).ours
        if plan.spec is None or not plan.spec.speculative.classes or ours.routing_set is desired:
            return
        extras = desired.objects()[1 + len(plan.pools):]
        memo = ours.routing
        complete = True
        for obj in extras:
            ident = (obj["kind"], obj["metadata"]["name"])
            text = json.dumps(obj, sort_keys=True)
            if memo.get(ident) == text:
                continue
            try:
                async with self.pools.in_turn():
                    await self.kube.apply(obj)
            except ApiError as err:
                if obj["kind"] != "InferencePool" or err.status.code != 404:
                    raise
                log.warning("%s/%s: InferencePool not applied (is the Gateway API Inference "
                            "Extension CRD installed?): %s", key[0], key[1], err.status.message)
                complete = False
                continue
            memo[ident] = text
        ours.routing_set = desired if complete else None

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
        ours = self.slot(key).ours
        seen = {("Service", n) for n in self.view.class_services(key)}
        stale = (seen | set(ours.routing)) - wanted
        if not stale:
            return
        if not classes:
            stale |= {("InferencePool", inference_pool_name(name)),
                      ("ConfigMap", picker_config_name(name))}
        uid = (body.get("metadata") or {}).get("uid") or ""
        order = {"InferencePool": 0, "ConfigMap": 1, "Service": 2}
        for kind, obj_name in sorted(stale, key=lambda i: (order[i[0]], i[1])):
            async with self.pools.in_turn():
                deleted = await self.kube.delete_owned(kind, key[0], obj_name, uid)
            ours.routing.pop((kind, obj_name), None)
            if deleted:
                log.info("%s/%s: %s %s deleted: no class of the spec routes through it",
                         key[0], name, kind, obj_name)

    async def remove_pools(
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
            await self.pools.delete_pool(key[0], dep)
            self.slot(key).ours.pools.pop(fate.key, None)
            self.slot(key).memos.drift.pop(fate.key, None)
            removed.append(fate.key)
            await self.kube.event(
                body, REASON_POOL_REMOVED, pool_removed(fate.key, fate.message)
            )
        return removed

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
        ours = self.slot(key).ours
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
        memo: dict[str, CanaryMemo] = ours.canaries
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

