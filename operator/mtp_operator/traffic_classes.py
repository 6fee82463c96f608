"""Traffic classes (`spec.speculative.classes`): each class as the spec its pools are planned
from, and the checks of the class list. Pure.

A class pool is planned exactly as a pool of a resource whose K and tuning are the class's:
`class_spec` gives that spec, so the profile table, maxSpeculativeTokens, mtpLayers, rollback
and tuning apply per (GPU product, class) unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from mtp_operator.api.classes import TrafficClass, class_list_problems
from mtp_operator.api.tuning import PoolTuningStatus
from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.naming import pool_key, split_pool_key
from mtp_operator.planning import (
    GPUNode,
    NodeInventory,
    PlanError,
    PoolFate,
    PoolPlan,
    plan_pool,
    pool_fates,
    validate_spec,
)
from mtp_operator.tuning.settings import tuning_problems
from mtp_operator.tuning.state import canary_k, planned_k, tuning_of
from mtp_runtime.problems import Problem

CLASSES_FIELD = "speculative.classes"


def classes_of(spec: MTPInferenceSpec) -> tuple[TrafficClass, ...]:
    """The spec's classes; empty: one pool per GPU product, as without classes."""
    return tuple(spec.speculative.classes or ())


def class_spec(spec: MTPInferenceSpec, cls: TrafficClass) -> MTPInferenceSpec:
    """The spec a pool of `cls` is planned from: the class's K, its tuning (else the
    resource's) and no classes."""
    s = spec.speculative
    speculative = s.model_copy(
        update={
            "num_speculative_tokens": cls.num_speculative_tokens,
            "tuning": tuning_of(spec, cls.name),
            "classes": None,
        }
    )
    return spec.model_copy(update={"speculative": speculative})


def class_specs(spec: MTPInferenceSpec) -> dict[str, MTPInferenceSpec]:
    """Each class's spec by class name (none without classes)."""
    return {c.name: class_spec(spec, c) for c in classes_of(spec)}


def _moved(problem: Problem, at: str, own_tuning: bool) -> Problem | None:
    """A problem of a class's spec, named by the class's field; None when it is the
    resource's own field (reported there already)."""
    field = problem.field
    if field == "speculative.numSpeculativeTokens":
        return Problem(f"{at}.numSpeculativeTokens", problem.message)
    if field.startswith("speculative.tuning") and own_tuning:
        return Problem(at + field.removeprefix("speculative"), problem.message)
    return None


def class_problems(spec: MTPInferenceSpec) -> list[Problem]:
    """The class list's problems (ranges, duplicates, defaults, headers), then each class's
    K and tuning checked as the resource's are, named by the class's field."""
    classes = classes_of(spec)
    if not classes:
        return []
    found = class_list_problems(classes, CLASSES_FIELD)
    for i, cls in enumerate(classes):
        at = f"{CLASSES_FIELD}[{i}]"
        cspec = class_spec(spec, cls)
        for p in validate_spec(cspec) + [Problem(*t) for t in tuning_problems(cspec)]:
            moved = _moved(Problem(*p), at, cls.tuning is not None)
            if moved is not None and moved not in found:
                found.append(moved)
    return found


def class_plans(
    spec: MTPInferenceSpec,
    product_plans: Sequence[PoolPlan],
    gpu_profiles: Mapping[str, int],
    rollback_k: Callable[[str], int | None],
    tuning: Mapping[str, PoolTuningStatus],
) -> tuple[list[PoolPlan], dict[str, PoolPlan]]:
    """One pool per (GPU product of `product_plans`, class), planned from the class's spec
    with its own rollback pin and tuned K (both by pool key), and the canary replicas of class
    pools in a canary trial (by pool key). A product plan's other fields (what the product's
    nodes decided) carry over. Raises PlanError as plan_pool does."""
    plans: list[PoolPlan] = []
    canaries: dict[str, PoolPlan] = {}
    for cls in classes_of(spec):
        cspec = class_spec(spec, cls)
        for base in product_plans:
            key = pool_key(base.gpu_product, cls.name)
            own = plan_pool(
                cspec, base.gpu_product, gpu_profiles, rollback_k(key), planned_k(tuning.get(key))
            )
            plan = replace(base, **_planned(own), traffic_class=cls.name)
            plans.append(plan)
            k = canary_k(tuning.get(key))
            if spec.replicas >= 2 and k is not None and k != plan.k:
                try:
                    trial = plan_pool(cspec, base.gpu_product, gpu_profiles, rollback_k(key), k)
                except PlanError:
                    continue
                canaries[key] = replace(base, **_planned(trial), traffic_class=cls.name)
    plans.sort(key=lambda p: p.key)
    return plans, canaries


def _planned(plan: PoolPlan) -> dict[str, Any]:
    return {"k": plan.k, "source": plan.source, "reason": plan.reason, "serve": plan.serve,
            "k_mode": plan.k_mode}


def class_pool_fates(
    spec: MTPInferenceSpec,
    nodes: Iterable[GPUNode] | NodeInventory,
    existing: Iterable[str],
    fitting: Iterable[str],
    gone_since: Mapping[str, datetime],
    now: datetime,
    grace_seconds: float,
) -> list[PoolFate]:
    """planning.pool_fates over existing pools named by pool key: a pool of a class the spec
    no longer has (or an unclassed pool once classes are set, or a class pool once they are
    removed) is removed at once, the user's edit; the others share their product's fate."""
    wanted: set[str | None] = {c.name for c in classes_of(spec)} or {None}
    keys = sorted(set(existing))
    fates: list[PoolFate] = []
    kept: dict[str, list[str | None]] = {}
    for key in keys:
        product, cls = split_pool_key(key)
        if cls in wanted:
            kept.setdefault(product, []).append(cls)
            continue
        why = (
            "spec.speculative.classes has no class " + repr(cls) if cls is not None
            else "spec.speculative.classes is set: each class gets pools of its own"
        )
        fates.append(PoolFate(product, "remove", "ExcludedBySpec", why, traffic_class=cls))
    for fate in pool_fates(spec, nodes, kept, fitting, gone_since, now, grace_seconds):
        fates += [replace(fate, traffic_class=cls) for cls in kept.get(fate.gpu_product, [])]
    fates.sort(key=lambda f: f.key)
    return fates
