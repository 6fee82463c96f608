"""The pure steps of one reconcile pass: plan the pools, then compose the status. No I/O.

`control/reconciler.py` runs a pass as plan → desired objects (`builders`) → apply (its only
I/O) → status; everything here is a function of its arguments, `now` included.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mtp_operator.api.tuning import PoolTuningStatus
from mtp_operator.api.v1alpha1 import (
    Condition,
    MTPInferenceSpec,
    MTPInferenceStatus,
    PoolStatus,
    ProductFit,
)
from mtp_operator.conditions import (
    MODEL_FITS,
    PROGRESSING,
    REASON_ALL_PRODUCTS_FIT,
    REASON_INVALID_SPEC,
    REASON_NO_FITTING_NODES,
    REASON_PRODUCTS_DO_NOT_FIT,
    RECONCILING,
    Want,
    merge,
)
from mtp_operator.drift import DRIFT_ANNOTATIONS, annotations_read
from mtp_operator.fit import Fit, summary
from mtp_operator.naming import ANNOTATION_GPU_PRODUCT, ANNOTATION_TRAFFIC_CLASS, pool_key
from mtp_operator.planning import (
    RETAINED_PRODUCT_GONE,
    GPUNode,
    NodeInventory,
    PlanError,
    PoolFate,
    PoolPlan,
    fitting_products,
    no_fit_problem,
    plan_pool,
    product_fits,
)
from mtp_operator.rollback.policy import RollbackDecision
from mtp_operator.rollback.state import RollbackView, pool_rollback_state, with_decisions
from mtp_operator.settings import DEFAULT_POOL_REMOVAL_GRACE_SECONDS
from mtp_operator.status import (
    MAX_STATUS_POOLS,
    ObservedPool,
    StatusInput,
    bounded,
    build_status,
    short_product,
    to_wire,
)
from mtp_operator.timestamps import format_time, parse_time
from mtp_operator.traffic_classes import class_plans, class_pool_fates, class_specs
from mtp_operator.tuning.state import (
    canaries_taking_a_replica,
    canary_plans,
    carried,
    planned_k,
    with_tuning,
)
from mtp_runtime.problems import Problem


@dataclass(frozen=True)
class Fold:
    """What one pass folds into the status it plans with (and its one status write persists):
    rollback decisions (control/rollback.py) and the tuner's new per-pool entries
    (control/tuner.py). `folded`: (the status the decisions were folded into by whoever made
    them, the result), reused by a pass that reads that same status, so that a decision is
    folded once (rollback.state.with_decisions)."""

    decisions: Sequence[RollbackDecision] = ()
    tuning: Mapping[str, PoolTuningStatus] = field(default_factory=dict)
    folded: tuple[MTPInferenceStatus, MTPInferenceStatus] | None = None

    def into(self, persisted: MTPInferenceStatus) -> MTPInferenceStatus:
        """`persisted` with the decisions and the tuning entries."""
        if self.folded is not None and self.folded[0] is persisted:
            with_rollbacks = self.folded[1]
        else:
            with_rollbacks = with_decisions(persisted, self.decisions)
        return with_tuning(with_rollbacks, self.tuning)

    @property
    def rolled_back(self) -> frozenset[str]:
        """The pools a decision rolls back in this pass (their Event says why)."""
        return frozenset(d.state.gpu_product for d in self.decisions if d.record is not None)


NO_FOLD = Fold()


@dataclass(frozen=True)
class PassPlan:
    """What a pass wants: the pools and their K, or the problems that block them."""

    spec: MTPInferenceSpec | None
    pools: list[PoolPlan]
    problems: list[Problem]
    problem_reason: str  # InvalidSpec or NoFittingNodes, when there are problems
    rollback: RollbackView
    # existing pools no node fits now: retained as they run, or removed (pool_fates)
    fates: list[PoolFate] = field(default_factory=list)
    tuning: Mapping[str, PoolTuningStatus] = field(default_factory=dict)  # kept, by product
    canaries: Mapping[str, PoolPlan] = field(default_factory=dict)  # tuning canary replicas
    fits: Mapping[str, Fit] = field(default_factory=dict)  # spec.fit's verdicts, by product

    @property
    def canaries_in_replicas(self) -> frozenset[str]:
        """Pools whose canary runs in one of their replicas (one replica less in builders);
        a canary started on a spare slot leaves its pool whole (issue 37)."""
        return canaries_taking_a_replica(self.canaries, self.tuning)


@dataclass(frozen=True)
class Applied:
    """What the apply step did: each written pool's settings hash, the products whose pools
    it removed, and the API error that stopped it (None: all applied)."""

    settings_hashes: Mapping[str, str] = field(default_factory=dict)
    removed: Sequence[str] = ()
    error: str | None = None
    retained: Sequence[tuple[PoolStatus, str]] = ()  # status entries of retained pools


def plan_pass(
    spec: MTPInferenceSpec | None,
    problems: Sequence[Problem],
    nodes: Iterable[GPUNode] | NodeInventory,
    previous: MTPInferenceStatus,
    metadata: Mapping[str, Any],
    gpu_profiles: Mapping[str, int],
    now: datetime,
    existing: Iterable[str] = (),
    grace_seconds: float = DEFAULT_POOL_REMOVAL_GRACE_SECONDS,
) -> PassPlan:
    """The pools a resource should have now (spec, GPU nodes, rollback pins in status), and
    the fate of the `existing` pools (by GPU product) no node fits now."""
    blocking = list(problems)
    rollback = pool_rollback_state(previous, metadata, metadata.get("generation"), now)
    reason = REASON_INVALID_SPEC
    plans: list[PoolPlan] = []
    fates: list[PoolFate] = []
    tuning = carried(previous, spec, metadata.get("generation"), now)  # measured K (tuning/)
    canaries: dict[str, PoolPlan] = {}
    fits: dict[str, Fit] = {}
    if spec is not None and not blocking:
        nodes = NodeInventory.of(nodes)
        fits = product_fits(spec, nodes) if spec.fit is not None else {}
        products = fitting_products(spec, nodes)  # a multi-node fit: a LeaderWorkerSet pool
        fates = class_pool_fates(  # pool_fates, existing pools named by pool key
            spec, nodes, existing, products, gone_since(previous), now, grace_seconds
        )
        if not products and not any(f.action == "retain" for f in fates):
            # Keep what serves now (a bad edit must not tear pools down); say why. Pools of
            # products no node carries any more still go after their grace period.
            blocking, reason = [no_fit_problem(spec, fits)], REASON_NO_FITTING_NODES
            fates = [f for f in fates if f.reason == RETAINED_PRODUCT_GONE]
        try:
            plans = [
                plan_pool(spec, p, gpu_profiles, rollback.k_for(p), planned_k(tuning.get(p)),
                          fits.get(p))
                for p in products
            ]
            canaries = canary_plans(spec, plans, tuning, rollback.k_for, gpu_profiles)
        except PlanError as err:
            blocking = list(err.problems)
        if spec.speculative.classes and not blocking:  # a pool per (product, class)
            try:
                plans, canaries = class_plans(spec, plans, gpu_profiles, rollback.k_for, tuning)
            except PlanError as err:
                blocking = list(err.problems)
        if not blocking:
            blocking = too_many_pools(spec, len(products), plans, fates)
            if blocking:
                plans, canaries = [], {}
    return PassPlan(spec, plans, blocking, reason, rollback, fates, tuning, canaries, fits)


def too_many_pools(
    spec: MTPInferenceSpec, products: int, plans: Sequence[PoolPlan], fates: Sequence[PoolFate]
) -> list[Problem]:
    """The pool cap (status.MAX_STATUS_POOLS): more pools (planned, and retained as they run)
    would make the status too large for etcd; refused, naming the field and the limit. The
    pools keep running as they are."""
    count = len(plans) + sum(1 for f in fates if f.action == "retain")
    if count <= MAX_STATUS_POOLS:
        return []
    classes = len(spec.speculative.classes or []) or 1
    shape = (f" ({products} GPU products x {classes} traffic classes)"
             if spec.speculative.classes else "")
    return [Problem(
        "gpuProducts",
        f"{count} pools{shape}: over the limit of {MAX_STATUS_POOLS} a resource (its status "
        "must stay well under etcd's 1.5 MiB object limit); list at most "
        f"{MAX_STATUS_POOLS // classes} GPU products in gpuProducts"
        + (" or use fewer speculative.classes" if spec.speculative.classes else "")
        + ", or split the model over several resources",
    )]


def gone_since(status: MTPInferenceStatus) -> dict[str, datetime]:
    """When each pool's GPU product was first seen gone from every node (status)."""
    out = {}
    for pool in status.pools:
        t = parse_time(pool.product_gone_since)
        if t is not None:
            out[pool.gpu_product] = t
    return out


def pass_status(
    name: str,
    generation: int | None,
    plan: PassPlan,
    previous: MTPInferenceStatus,
    observed: Mapping[str, ObservedPool],
    applied: Applied,
    now: datetime,
) -> MTPInferenceStatus:
    """The status after a pass: the pools as planned and observed, or the problems; with
    spec.fit, each product's fit (status.fit, fitSummary, condition ModelFits)."""
    status = _pass_status(name, generation, plan, previous, observed, applied, now)
    return bounded(with_fit(status, plan, generation, now))  # the size bound (issue 36)


def with_fit(
    status: MTPInferenceStatus, plan: PassPlan, generation: int | None, now: datetime
) -> MTPInferenceStatus:
    """`status` with the pass's fit verdicts. Without spec.fit: fitSummary `not checked`, no
    fit entries and no ModelFits condition."""
    if plan.spec is None:
        return status
    if plan.spec.fit is None:
        conditions = [c for c in status.conditions if c.type != MODEL_FITS]
        return status.model_copy(
            update={"fit": [], "fit_summary": "not checked", "conditions": conditions}
        )
    fits = sorted(plan.fits.values(), key=lambda f: f.product)
    entries = [
        ProductFit(
            gpu_product=f.product,
            verdict=f.verdict,
            nodes_per_replica=f.nodes if f.placeable else 0,
            gpus_per_node=f.gpus_per_node,
            gpu_memory_mib=f.gpu_memory_mib,
            message=f.message,
        )
        for f in fits
    ]
    refused = [f for f in fits if not f.placeable]
    if refused:
        want = Want(
            MODEL_FITS, False, REASON_PRODUCTS_DO_NOT_FIT,
            "; ".join(f"{f.product}: {f.message}" for f in refused),
        )
    else:
        want = Want(MODEL_FITS, True, REASON_ALL_PRODUCTS_FIT, summary(fits, {}))
    prev = [c.model_dump(by_alias=True) for c in status.conditions]
    merged = merge(prev, [want], format_time(now), generation)
    nodes = {f.product: f.nodes for f in fits if f.placeable}
    pools = [
        p.model_copy(update={
            "nodes_per_replica": nodes[p.gpu_product],
            "tuning": multi_node_tuning(plan.spec, p, nodes[p.gpu_product]),
        })
        if nodes.get(p.gpu_product, 1) > 1 else p
        for p in status.pools
    ]
    return status.model_copy(
        update={
            "pools": pools,
            "fit": entries,
            "fit_summary": summary(fits, {f.product: short_product(f.product) for f in fits}),
            "conditions": [Condition.model_validate(c) for c in merged],
        }
    )


MULTI_NODE_NOT_TUNED = (
    "not tuned: a multi-node pool (a LeaderWorkerSet of {nodes} nodes per replica); a trial "
    "would restart whole groups and a canary would hold {nodes} more nodes, so it runs the "
    "K its plan gives"
)


def multi_node_tuning(
    spec: MTPInferenceSpec, pool: PoolStatus, nodes: int
) -> PoolTuningStatus | None:
    """The tuning entry of a multi-node pool: the tuner leaves it alone (control/tuner.py
    skips pools with nodesPerReplica above 1), and says so where tuning is on."""
    mode = class_specs(spec).get(pool.traffic_class or "", spec).speculative.tuning.mode
    if mode == "Off":
        return pool.tuning
    return PoolTuningStatus(mode=mode, reason=MULTI_NODE_NOT_TUNED.format(nodes=nodes))


def _pass_status(
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
        if applied.removed:
            kept = [p for p in previous.pools if p.gpu_product not in applied.removed]
            previous = previous.model_copy(update={"pools": kept})
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
        retained=applied.retained,
        tuning=plan.tuning,
    )
    status = build_status(inputs, format_time(now))
    if plan.rollback.handled_reset_token:
        status = status.model_copy(
            update={"rollback_reset_token": plan.rollback.handled_reset_token}
        )
    return status


def significant(status: MTPInferenceStatus) -> dict[str, Any]:
    """Status without what only reports progress: replica counts, condition messages, and,
    while the phase is Progressing, the Progressing/Reconciling conditions (a rollout moving
    from "rolling out" to "waiting for pods" changes neither the phase nor Ready)."""
    wire = to_wire(status)
    out = {k: v for k, v in wire.items() if k not in ("conditions", "ready")}
    out["pools"] = [
        {k: v for k, v in p.items() if k not in ("replicas", "readyReplicas")}
        for p in wire.get("pools") or []
    ]
    rolling = wire.get("phase") == "Progressing"
    out["conditions"] = [
        (c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration"))
        for c in wire.get("conditions") or []
        if not (rolling and c.get("type") in (PROGRESSING, RECONCILING))
    ]
    return out


def resource_version(body: Mapping[str, Any]) -> int:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


# The annotations of a pool Deployment that a pass reads (its product, and what drift and a
# retained pool's status entry compare); others' annotations are not read.
POOL_ANNOTATIONS_READ = (ANNOTATION_GPU_PRODUCT, ANNOTATION_TRAFFIC_CLASS, *DRIFT_ANNOTATIONS)


def pool_inputs(deployment: Mapping[str, Any], observed: ObservedPool) -> tuple[Any, ...]:
    """Everything a pass reads of a pool Deployment (`observed` is observe_deployment of
    it): its counts, spec, labels, our annotations, name and deletion. A watch event that
    leaves these as the last pass saw them (a condition's reason, availableReplicas, the
    controller's observedGeneration catching up with no count changing, the revision
    annotation the Deployment controller adds) cannot change that pass's writes or status,
    so it brings no pass."""
    meta = deployment.get("metadata") or {}
    return (
        observed,
        deployment.get("spec"),
        meta.get("labels"),
        annotations_read(deployment, POOL_ANNOTATIONS_READ),
        meta.get("name"),
        meta.get("deletionTimestamp"),
    )


def product_of(deployment: Mapping[str, Any]) -> str | None:
    """The pool a Deployment (or canary pod) is, by pool key (naming.pool_key): its GPU
    product, or `product/class` for a class pool."""
    annotations = (deployment.get("metadata") or {}).get("annotations") or {}
    product = annotations.get(ANNOTATION_GPU_PRODUCT)
    traffic_class = annotations.get(ANNOTATION_TRAFFIC_CLASS)
    return pool_key(product, traffic_class) if product and traffic_class else product
