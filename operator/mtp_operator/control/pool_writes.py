"""Writes to one resource's pool Deployments: create, update, revert, remove, retain.

Part of the Reconciler (a mixin: it uses the reconciler's `kube`, `slot`, `clock` and
`reconcile_later`), kept apart to keep each module readable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtp_operator.adapters.telemetry import OPERATOR_METRICS
from mtp_operator.drift import drifted_fields
from mtp_operator.naming import ANNOTATION_SETTINGS_HASH
from mtp_operator.planning import PoolFate, PoolPlan
from mtp_operator.status import observe_deployment, retained_entry
from mtp_operator.timestamps import format_time

Key = tuple[str, str]  # (namespace, name)


def resource_version(body: Mapping[str, Any]) -> int:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class PoolWrites:
    kube: Any

    async def _remove_pools(
        self,
        key: Key,
        body: Mapping[str, Any],
        observed: Mapping[str, Mapping[str, Any]],
        fates: list[PoolFate],
    ) -> list[str]:
        """Delete the pools whose fate is removal; returns their GPU products."""
        removed = []
        for fate in fates:
            if fate.action != "remove" or fate.gpu_product not in observed:
                continue
            dep = observed[fate.gpu_product]
            await self.kube.delete_deployment(key[0], dep["metadata"]["name"])
            self.slot(key).pools.pop(fate.gpu_product, None)
            removed.append(fate.gpu_product)
            await self.kube.event(
                body, "PoolRemoved", f"removed pool {fate.gpu_product}: {fate.message}"
            )
        return removed

    async def _retained(
        self,
        key: Key,
        body: Mapping[str, Any],
        previous: Mapping[str, Any],
        observed: Mapping[str, Mapping[str, Any]],
        fates: list[PoolFate],
    ) -> list[tuple[dict[str, Any], str]]:
        """Status entries of the pools kept as they run; an Event when one starts being kept,
        and a pass at the earliest removal deadline."""
        before = {p.get("gpuProduct"): p for p in previous.get("pools") or []}
        out = []
        for fate in fates:
            if fate.action != "retain" or fate.gpu_product not in observed:
                continue
            dep = observed[fate.gpu_product]
            prev = before.get(fate.gpu_product)
            since = format_time(fate.gone_since) if fate.gone_since else None
            entry = retained_entry(
                key[1], prev, dep, observe_deployment(dep), fate.reason, since
            )
            if (prev or {}).get("retained") != fate.reason:
                await self.kube.event(
                    body, "PoolRetained", f"pool {fate.gpu_product}: {fate.message}", "Warning"
                )
            if fate.remove_at is not None:
                delay = (fate.remove_at - self.clock()).total_seconds()
                self.reconcile_later(key, max(delay, 0.0) + 0.5)
            out.append((entry, fate.message))
        return out

    async def _write_pool(
        self,
        owner: Mapping[str, Any],
        plan: PoolPlan,
        desired: Mapping[str, Any],
        replace_rv: str | None = None,
    ) -> None:
        if replace_rv is not None:  # someone added fields: only a full replace removes them
            out = await self.kube.replace(desired, replace_rv)
        else:
            out = await self.kube.apply(desired)
        OPERATOR_METRICS.deployment_writes.inc()
        meta = owner.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if resource_version(out):
            self.slot(key).pools[plan.gpu_product] = out

    async def _apply_pool(
        self,
        owner: Mapping[str, Any],
        desired: Mapping[str, Any],
        plan: PoolPlan,
        observed: Mapping[str, Any] | None,
    ) -> None:
        if observed is not None:
            changed = drifted_fields(desired, observed)
            if not changed:
                return
            ours = desired["metadata"]["annotations"][ANNOTATION_SETTINGS_HASH]
            theirs = (
                (observed.get("metadata") or {})
                .get("annotations", {})
                .get(ANNOTATION_SETTINGS_HASH)
            )
            added = any(c.startswith("added ") for c in changed)
            rv = (observed.get("metadata") or {}).get("resourceVersion") if added else None
            await self._write_pool(owner, plan, desired, rv)
            if ours == theirs:
                await self.kube.event(
                    owner,
                    "ManualChangeReverted",
                    f"pool {plan.gpu_product}: {', '.join(changed)} edited outside the "
                    "operator; restored the operator's settings (change the MTPInference "
                    "spec instead)",
                    "Warning",
                )
            else:
                await self.kube.event(
                    owner,
                    "PoolUpdated",
                    f"pool {plan.gpu_product}: K={plan.k} ({plan.source}: {plan.reason})",
                )
            return
        await self._write_pool(owner, plan, desired)
        await self.kube.event(
            owner,
            "PoolCreated",
            f"pool {plan.gpu_product}: deployment {desired['metadata']['name']}, K={plan.k} "
            f"({plan.source}: {plan.reason})",
        )
