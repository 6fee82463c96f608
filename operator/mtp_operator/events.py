"""The Events the operator posts on an MTPInference: reasons and messages, named once. Pure.

Reasons are public names (`kubectl get events --field-selector reason=...`, alerting on
Events), like the condition reasons in conditions.py; a spec that cannot be served is
announced with its condition reason (`InvalidSpec`, `NoFittingNodes`) and the problems.
"""

from __future__ import annotations

from collections.abc import Iterable

from mtp_operator.api.v1alpha1 import RollbackRecord
from mtp_operator.conditions import REASON_INVALID_SPEC, REASON_NO_FITTING_NODES
from mtp_operator.planning import PoolPlan

REASON_POOL_CREATED = "PoolCreated"
REASON_POOL_UPDATED = "PoolUpdated"
REASON_POOL_REMOVED = "PoolRemoved"
REASON_MANUAL_CHANGE_REVERTED = "ManualChangeReverted"
REASON_SPECULATION_ROLLED_BACK = "SpeculationRolledBack"
# a spec that cannot be served: the Degraded condition's reason, as the Event's
BLOCKED_REASONS = (REASON_INVALID_SPEC, REASON_NO_FITTING_NODES)


def pool_created(plan: PoolPlan, deployment: str) -> str:
    return (
        f"pool {plan.gpu_product}: deployment {deployment}, K={plan.k} "
        f"({plan.source}: {plan.reason})"
    )


def pool_updated(plan: PoolPlan) -> str:
    return f"pool {plan.gpu_product}: K={plan.k} ({plan.source}: {plan.reason})"


def pool_removed(product: str) -> str:
    return (
        f"removed pool {product}: no schedulable node of this GPU product fits "
        "any more, or gpuProducts no longer lists it"
    )


def manual_change_reverted(product: str, changed: Iterable[str]) -> str:
    return (
        f"pool {product}: {', '.join(changed)} edited outside the "
        "operator; restored the operator's settings (change the MTPInference "
        "spec instead)"
    )


def speculation_rolled_back(record: RollbackRecord) -> str:
    return (
        f"pool {record.gpu_product}: K {record.from_k} -> {record.to_k} ({record.reason},"
        f" via {record.via})"
    )
