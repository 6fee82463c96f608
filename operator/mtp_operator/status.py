"""The MTPInference status the operator reports. Pure: observations and `now` in, dict out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mtp_operator import conditions as c
from mtp_operator.naming import pool_deployment_name, product_slug
from mtp_operator.planning import PoolPlan
from mtp_runtime.gpu_profiles import product_family

MAX_REMOVED_POOLS = 10


@dataclass(frozen=True)
class ObservedPool:
    """What a pool Deployment says about itself."""

    desired: int
    ready: int
    up_to_date: bool  # the Deployment controller has seen and rolled out the current spec


def observe_deployment(body: Mapping[str, Any]) -> ObservedPool:
    spec, st = body.get("spec") or {}, body.get("status") or {}
    desired = int(spec.get("replicas", 1))
    generation = (body.get("metadata") or {}).get("generation", 0)
    up_to_date = (
        st.get("observedGeneration", 0) >= generation
        and st.get("updatedReplicas", 0) >= desired
        and st.get("replicas", 0) <= desired
    )
    return ObservedPool(desired, int(st.get("readyReplicas", 0)), up_to_date)


def short_product(product: str) -> str:
    return product_family(product) or product_slug(product).upper()


@dataclass
class StatusInput:
    name: str
    generation: int | None
    previous: Mapping[str, Any]  # the current status (may be empty)
    plans: Sequence[PoolPlan]  # pools that should exist now
    observed: Mapping[str, ObservedPool]  # by GPU product
    rollback_state: Mapping[str, Mapping[str, Any]]  # by GPU product: rollback fields to keep
    settings_hashes: Mapping[str, str]
    problems: Sequence[tuple[str, str]] = ()  # spec problems: reported, pools left as they were
    problem_reason: str = c.REASON_INVALID_SPEC  # or NoFittingNodes
    apply_error: str | None = None
    removed: Sequence[str] = field(default_factory=list)
    tuning: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # by GPU product


def _pool_entry(i: StatusInput, plan: PoolPlan) -> dict[str, Any]:
    seen = i.observed.get(plan.gpu_product)
    entry: dict[str, Any] = {
        "gpuProduct": plan.gpu_product,
        "numSpeculativeTokens": plan.k,
        "source": plan.source,
        "reason": plan.reason,
        "replicas": seen.desired if seen else 0,
        "readyReplicas": seen.ready if seen else 0,
        "deployment": pool_deployment_name(i.name, plan.gpu_product),
        "settingsHash": i.settings_hashes.get(plan.gpu_product, ""),
    }
    for key, value in (i.rollback_state.get(plan.gpu_product) or {}).items():
        if value is not None:
            entry[key] = value
    if i.tuning.get(plan.gpu_product):
        entry["tuning"] = dict(i.tuning[plan.gpu_product])
    return entry


def build_status(i: StatusInput, now: str) -> dict[str, Any]:
    prev_conditions = list(i.previous.get("conditions") or [])
    if i.problems:
        # The spec can't be served as written: say so, and leave the pools as they were.
        message = "; ".join(f"{f}: {m}" for f, m in i.problems)
        wanted = [
            c.Want(c.DEGRADED, True, i.problem_reason, message),
            c.Want(c.PROGRESSING, False, i.problem_reason, "spec change not applied"),
        ]
        invalid = i.problem_reason == c.REASON_INVALID_SPEC
        wanted = c.with_kstatus(wanted, stalled=True)
        return {
            **{k: v for k, v in i.previous.items() if k != "conditions"},
            "observedGeneration": i.generation,
            "phase": "Invalid" if invalid else "Degraded",
            "conditions": c.merge(prev_conditions, wanted, now, i.generation),
        }

    pools = [_pool_entry(i, p) for p in i.plans]
    desired = sum(p["replicas"] for p in pools)
    ready = sum(p["readyReplicas"] for p in pools)
    rolling = [
        p.gpu_product
        for p in i.plans
        if p.gpu_product not in i.observed or not i.observed[p.gpu_product].up_to_date
    ]
    all_ready = bool(pools) and not rolling and ready >= desired
    rolled_back = [p for p in pools if p["source"] == "rollback"]

    wanted = []
    if i.apply_error:
        wanted.append(c.Want(c.DEGRADED, True, c.REASON_APPLY_FAILED, i.apply_error))
    else:
        wanted.append(c.Want(c.DEGRADED, False, c.REASON_HEALTHY))
    if all_ready:
        reason = c.REASON_NO_REPLICAS if desired == 0 else c.REASON_ALL_POOLS_READY
        wanted.append(c.Want(c.READY, True, reason, f"{ready}/{desired} replicas ready"))
    else:
        wanted.append(
            c.Want(c.READY, False, c.REASON_POOLS_NOT_READY, f"{ready}/{desired} replicas ready")
        )
    if rolling:
        wanted.append(
            c.Want(c.PROGRESSING, True, c.REASON_ROLLING_OUT, "rolling out: " + ", ".join(rolling))
        )
    else:
        wanted.append(c.Want(c.PROGRESSING, False, c.REASON_STABLE))
    if rolled_back:
        msg = ", ".join(
            f"{p['gpuProduct']} K={p['numSpeculativeTokens']} ({p['reason']})" for p in rolled_back
        )
        wanted.append(c.Want(c.ROLLED_BACK, True, c.REASON_ROLLED_BACK, msg))
    else:
        wanted.append(c.Want(c.ROLLED_BACK, False, c.REASON_NOT_ROLLED_BACK))

    wanted = c.with_kstatus(wanted, stalled=False)  # an API error is retried, not stalled
    if i.apply_error:
        phase = "Degraded"
    elif all_ready:
        phase = "Ready"
    else:
        phase = "Progressing"
    removed = list(i.previous.get("removedPools") or [])
    removed = [r for r in removed if r not in {p.gpu_product for p in i.plans}]
    removed = (removed + [r for r in i.removed if r not in removed])[-MAX_REMOVED_POOLS:]
    return {
        "observedGeneration": i.generation,
        "phase": phase,
        "conditions": c.merge(prev_conditions, wanted, now, i.generation),
        "pools": pools,
        "rollbacks": list(i.previous.get("rollbacks") or []),
        "poolsSummary": " ".join(
            f"{short_product(p['gpuProduct'])}:{p['numSpeculativeTokens']}" for p in pools
        ),
        "ready": f"{ready}/{desired}",
        "removedPools": removed,
        **_tuning_summary(pools),
    }


def _tuning_summary(pools: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """`tuningSummary`: the recommended K per tuned pool (`-` while it has none yet)."""
    parts = []
    for p in pools:
        tuning = p.get("tuning")
        if tuning:
            rec = tuning.get("recommendedK")
            parts.append(f"{short_product(p['gpuProduct'])}:{'-' if rec is None else rec}")
    return {"tuningSummary": " ".join(parts)} if parts else {}


def status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when writing `new` would tell the reader something `old` doesn't."""
    a = {k: v for k, v in old.items() if k != "conditions"}
    b = {k: v for k, v in new.items() if k != "conditions"}
    if a != b:
        return True
    return not c.same_ignoring_time(
        list(old.get("conditions") or []), list(new.get("conditions") or [])
    )
