"""The Events the operator posts on an MTPInference: reasons and messages, named once. Pure.

Reasons are public names (`kubectl get events --field-selector reason=...`, alerting on
Events), like the condition reasons in conditions.py; a spec that cannot be served is
announced with its condition reason (`InvalidSpec`, `NoFittingNodes`) and the problems.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mtp_operator.api.v1alpha1 import MTPInferenceStatus, RollbackRecord
from mtp_operator.conditions import REASON_INVALID_SPEC, REASON_NO_FITTING_NODES
from mtp_operator.naming import pool_key
from mtp_operator.planning import PoolPlan

REASON_POOL_CREATED = "PoolCreated"
REASON_POOL_UPDATED = "PoolUpdated"
REASON_POOL_REMOVED = "PoolRemoved"
REASON_POOL_RETAINED = "PoolRetained"
REASON_MANUAL_CHANGE_REVERTED = "ManualChangeReverted"
REASON_SPECULATION_ROLLED_BACK = "SpeculationRolledBack"
REASON_TUNING_CANARY_DELETED = "TuningCanaryDeleted"  # no live trial names it (issue 36)
REASON_TUNING_TRIAL_STARTED = "TuningTrialStarted"
REASON_TUNING_ADOPTED = "TuningAdopted"
REASON_TUNING_TRIAL_ENDED = "TuningTrialEnded"  # returned to the incumbent, or aborted
REASON_TUNING_RECOMMENDED = "TuningRecommended"
REASON_TUNING_FAILED = "TuningFailed"  # the tuner's write for one resource failed
REASON_CONCURRENCY_AT_CAPACITY = "ConcurrencyAtCapacity"  # requests wait for KV space at K
REASON_PRODUCT_DOES_NOT_FIT = "ProductDoesNotFit"  # spec.fit: a GPU product gets no pool
# a spec that cannot be served: the Degraded condition's reason, as the Event's
BLOCKED_REASONS = (REASON_INVALID_SPEC, REASON_NO_FITTING_NODES)
# the longest message an Event carries (kube.KubeClient.event cuts a longer one)
MESSAGE_LIMIT = 1024
POOL_SEPARATOR = "; "


def pool_messages(messages: Sequence[str], limit: int = MESSAGE_LIMIT) -> list[str]:
    """The messages of one reason's pools, joined into as few Event messages as fit `limit`
    each, in order: a rollout of four pools is one PoolCreated Event naming the four (one
    Event per pool was a third of the operator's API requests in a large rollout), and no
    pool's message is cut to make room for another's."""
    out: list[str] = []
    for message in messages:
        if out and len(out[-1]) + len(POOL_SEPARATOR) + len(message) <= limit:
            out[-1] += POOL_SEPARATOR + message
        else:
            out.append(message)
    return out


def pool_created(plan: PoolPlan, deployment: str) -> str:
    return (
        f"pool {plan.gpu_product}: deployment {deployment}, K={plan.k} "
        f"({plan.source}: {plan.reason})"
    )


def pool_updated(plan: PoolPlan) -> str:
    return f"pool {plan.gpu_product}: K={plan.k} ({plan.source}: {plan.reason})"


def pool_removed(product: str, why: str) -> str:
    return f"removed pool {product}: {why}"


def pool_retained(product: str, why: str) -> str:
    return f"pool {product}: {why}"


def manual_change_reverted(product: str, changed: Iterable[str]) -> str:
    return (
        f"pool {product}: {', '.join(changed)} edited outside the "
        "operator; restored the operator's settings (change the MTPInference "
        "spec instead)"
    )


def _pool(record: RollbackRecord) -> str:
    """The pool a rollback record is of: its product, `product/class` for a class pool."""
    return pool_key(record.gpu_product, record.traffic_class)


def speculation_rolled_back(record: RollbackRecord) -> str:
    return (
        f"pool {_pool(record)}: K {record.from_k} -> {record.to_k} ({record.reason},"
        f" via {record.via})"
    )


def speculation_rolled_back_steps(records: Sequence[RollbackRecord]) -> str:
    """One Event for the steps one pass took on one pool (a batch of alerts with no
    cooldown steps K once per alert); status.rollbacks keeps every step."""
    if len(records) == 1:
        return speculation_rolled_back(records[0])
    first, last = records[0], records[-1]
    return (
        f"pool {_pool(first)}: K {first.from_k} -> {last.to_k} in {len(records)} steps"
        f" (last: {last.reason}, via {last.via}; each step in status.rollbacks)"
    )


def fit_refusals(before: MTPInferenceStatus, after: MTPInferenceStatus) -> list[str]:
    """ProductDoesNotFit messages: each refused product (status.fit) whose refusal is new or
    says something new, with the numbers."""
    old = {f.gpu_product: f.message for f in before.fit if f.verdict == "DoesNotFit"}
    return [
        f"{f.gpu_product} gets no pool: {f.message}"
        for f in after.fit
        if f.verdict == "DoesNotFit" and old.get(f.gpu_product) != f.message
    ]
