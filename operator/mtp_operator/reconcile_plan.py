"""The pure steps of one reconcile pass: plan the pools, then compose the status. No I/O.

`control/reconciler.py` runs a pass as plan → desired objects (`builders`) → apply (its only
I/O) → status; everything here is a function of its arguments, `now` included.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mtp_operator.api.v1alpha1 import MTPInferenceSpec, MTPInferenceStatus
from mtp_operator.conditions import REASON_INVALID_SPEC, REASON_NO_FITTING_NODES
from mtp_operator.naming import ANNOTATION_GPU_PRODUCT
from mtp_operator.planning import (
    GPUNode,
    PlanError,
    PoolPlan,
    fitting_products,
    no_fit_problem,
    plan_pool,
)
from mtp_operator.rollback.state import RollbackView, pool_rollback_state
from mtp_operator.status import ObservedPool, StatusInput, build_status, to_wire
from mtp_operator.timestamps import format_time
from mtp_runtime.problems import Problem


@dataclass(frozen=True)
class PassPlan:
    """What a pass wants: the pools and their K, or the problems that block them."""

    spec: MTPInferenceSpec | None
    pools: list[PoolPlan]
    problems: list[Problem]
    problem_reason: str  # InvalidSpec or NoFittingNodes, when there are problems
    rollback: RollbackView


@dataclass(frozen=True)
class Applied:
    """What the apply step did: each written pool's settings hash, the products whose pools
    it removed, and the API error that stopped it (None: all applied)."""

    settings_hashes: Mapping[str, str] = field(default_factory=dict)
    removed: Sequence[str] = ()
    error: str | None = None


def plan_pass(
    spec: MTPInferenceSpec | None,
    problems: Sequence[Problem],
    nodes: Iterable[GPUNode],
    previous: MTPInferenceStatus,
    metadata: Mapping[str, Any],
    gpu_profiles: Mapping[str, int],
    now: datetime,
) -> PassPlan:
    """The pools a resource should have now (spec, GPU nodes, rollback pins in status)."""
    blocking = list(problems)
    rollback = pool_rollback_state(previous, metadata, metadata.get("generation"), now)
    reason = REASON_INVALID_SPEC
    plans: list[PoolPlan] = []
    if spec is not None and not blocking:
        products = fitting_products(spec, nodes)
        if not products:
            # Keep what serves now (a bad edit must not tear pools down); say why.
            blocking, reason = [no_fit_problem(spec)], REASON_NO_FITTING_NODES
        try:
            plans = [plan_pool(spec, p, gpu_profiles, rollback.k_for(p)) for p in products]
        except PlanError as err:
            blocking = list(err.problems)
    return PassPlan(spec, plans, blocking, reason, rollback)


def pass_status(
    name: str,
    generation: int | None,
    plan: PassPlan,
    previous: MTPInferenceStatus,
    observed: Mapping[str, ObservedPool],
    applied: Applied,
    now: datetime,
) -> MTPInferenceStatus:
    """The status after a pass: the pools as planned and observed, or the problems."""
    if plan.problems:
        inputs = StatusInput(
            name=name,
            generation=generation,
            previous=previous,
            plans=[],
            observed=observed,
            rollback_state={},
            settings_hashes={},
            problems=plan.problems,
            problem_reason=plan.problem_reason,
        )
        return build_status(inputs, format_time(now))
    assert plan.spec is not None
    inputs = StatusInput(
        name=name,
        generation=generation,
        previous=previous,
        plans=plan.pools,
        observed=observed,
        rollback_state=plan.rollback.by_product(
            plan.pools, plan.spec.rollback, plan.spec.speculative.mtp_layers
        ),
        settings_hashes=applied.settings_hashes,
        apply_error=applied.error,
        removed=applied.removed,
    )
    status = build_status(inputs, format_time(now))
    if plan.rollback.handled_reset_token:
        status = status.model_copy(
            update={"rollback_reset_token": plan.rollback.handled_reset_token}
        )
    return status


def significant(status: MTPInferenceStatus) -> dict[str, Any]:
    """Status without what only counts progress: replica counts and condition messages."""
    wire = to_wire(status)
    out = {k: v for k, v in wire.items() if k not in ("conditions", "ready")}
    out["pools"] = [
        {k: v for k, v in p.items() if k not in ("replicas", "readyReplicas")}
        for p in wire.get("pools") or []
    ]
    out["conditions"] = [
        (c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration"))
        for c in wire.get("conditions") or []
    ]
    return out


def resource_version(body: Mapping[str, Any]) -> int:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def product_of(deployment: Mapping[str, Any]) -> str | None:
    return ((deployment.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_GPU_PRODUCT)
