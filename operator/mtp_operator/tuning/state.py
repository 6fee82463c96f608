"""A pool's tuning state as kept in `status.pools[].tuning`, and back. Pure.

Status is the store (a restarted operator keeps the tuned K, the trial running and the trial
history); the measured table is in memory only and is measured again after a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from mtp_operator.api.tuning import (
    MAX_CAPACITY_COST_CHARS,
    MAX_TRIAL_HISTORY,
    MAX_TUNING_ROWS,
    PoolTuningStatus,
    TuningSpec,
    TuningTrial,
)
from mtp_operator.api.v1alpha1 import MTPInferenceSpec, MTPInferenceStatus, PoolStatus
from mtp_operator.planning import PlanError, PoolPlan, plan_pool
from mtp_operator.status import SUMMARISED_NOTE, bounded_tuning
from mtp_operator.timestamps import format_time, parse_time

from .capacity import Capacity
from .decision import Guard, Trial, TuningDecision
from .estimator import CostFit, Measurement


def carried(
    previous: MTPInferenceStatus, spec: MTPInferenceSpec | None, generation: int | None,
    now: datetime | None = None,
) -> dict[str, PoolTuningStatus]:
    """The tuning entries a reconcile pass keeps, by GPU product: none when tuning is off, and
    none from another spec generation (a new generation starts tuning over from the spec),
    except that a trial the new generation ended is kept in a fresh entry's history as
    `superseded` (issue 36: a spec edit mid-trial is recorded, not forgotten)."""
    if spec is None or all(mode == "Off" for mode in tuning_modes(spec)):
        return {}
    out: dict[str, PoolTuningStatus] = {}
    for p in previous.pools:
        entry = p.tuning
        if entry is None:
            continue
        if entry.generation == generation:
            out[p.key] = entry
        elif entry.trial is not None and now is not None:
            out[p.key] = superseded(entry, spec, p.traffic_class, generation, now)
    return out


def superseded(entry: PoolTuningStatus, spec: MTPInferenceSpec, traffic_class: str | None,
               generation: int | None, now: datetime) -> PoolTuningStatus:
    """The new generation's first entry for a pool whose trial a spec change ended: nothing
    measured, no trial, no tuned K; the ended trial last in its history."""
    assert entry.trial is not None
    why = (f"the spec changed (generation {entry.generation} -> {generation}): tuning starts "
           "over from the spec's K")
    ended = entry.trial.model_copy(update={"ended": format_time(now), "outcome": "superseded",
                                           "reason": why})
    return PoolTuningStatus(
        mode=tuning_of(spec, traffic_class).mode, reason=why,
        trials=[*entry.trials, ended][-MAX_TRIAL_HISTORY:], generation=generation,
        updated=format_time(now),
    )


def tuning_of(spec: MTPInferenceSpec, traffic_class: str | None) -> TuningSpec:
    """The tuning settings the pool of `traffic_class` runs: the class's own, else the
    resource's (None: the resource's)."""
    s = spec.speculative
    for c in s.classes or ():
        if c.name == traffic_class and c.tuning is not None:
            return c.tuning
    return s.tuning


def with_tuning(
    status: MTPInferenceStatus, updates: Mapping[str, PoolTuningStatus]
) -> MTPInferenceStatus:
    """`status` with the tuner's new entries in their pools (pools it does not list: left)."""
    if not updates:
        return status
    pools = [
        p.model_copy(update={"tuning": updates[p.key]})
        if p.key in updates else p
        for p in status.pools
    ]
    return status.model_copy(update={"pools": pools})


def stamped(entry: PoolTuningStatus, previous: PoolTuningStatus | None) -> PoolTuningStatus:
    """`entry` with `updated` kept from `previous` when nothing else in it changed: a window
    that changes nothing makes no status write (issue 36); `updated` says when the entry last
    changed. `previous` is what the status holds, bounded (`status.bounded`: a summarised pool
    has no report, long texts are cut), so `entry` is compared as the bound would leave it."""
    if previous is None or previous.updated is None:
        return entry
    full = not previous.reason.endswith(SUMMARISED_NOTE)
    if bounded_tuning(entry, full).model_copy(update={"updated": None}) != previous.model_copy(
        update={"updated": None}
    ):
        return entry
    return entry.model_copy(update={"updated": previous.updated})


def tuning_modes(spec: MTPInferenceSpec) -> set[str]:
    """The tuning modes the resource's pools run: the resource's, or with classes each
    class's own (else the resource's)."""
    s = spec.speculative
    if not s.classes:
        return {s.tuning.mode}
    return {tuning_of(spec, c.name).mode for c in s.classes}


def trial_from(raw: TuningTrial | None) -> Trial | None:
    started = parse_time(raw.started) if raw is not None else None
    if raw is None or started is None:
        return None
    return Trial(raw.k, raw.from_k, started, raw.kind, parse_time(raw.ended), raw.outcome,
                 raw.reason, raw.beside_pool, raw.capacity_cost)


def trial_status(t: Trial) -> TuningTrial:
    return TuningTrial(
        k=t.k, from_k=t.from_k, kind=t.kind, started=format_time(t.started),
        ended=format_time(t.ended) if t.ended is not None else None, outcome=t.outcome,
        reason=t.reason, beside_pool=t.beside_pool,
        capacity_cost=t.capacity_cost[:MAX_CAPACITY_COST_CHARS],
    )


def planned_k(tuning: PoolTuningStatus | None) -> int | None:
    """The K tuning wants the whole pool at: a whole-pool trial's K, else the adopted K."""
    if tuning is None:
        return None
    if tuning.trial is not None and tuning.trial.kind == "pool":
        return tuning.trial.k
    return tuning.tuned_k


def canary_k(tuning: PoolTuningStatus | None) -> int | None:
    """The K of a canary trial running now, if any."""
    trial = tuning.trial if tuning is not None else None
    return trial.k if trial is not None and trial.kind == "canary" else None


def canaries_taking_a_replica(
    canaries: Iterable[str], tuning: Mapping[str, PoolTuningStatus]
) -> frozenset[str]:
    """The pools (keys) of `canaries` whose canary runs in one of the pool's replicas: all but
    those whose trial started on a spare slot beside the full pool (issue 37). What the trial
    started with holds to its end, so a pool does not shrink once its canary holds the slot."""
    out = set()
    for key in canaries:
        trial = tuning[key].trial if key in tuning else None
        if not (trial is not None and trial.kind == "canary" and trial.beside_pool):
            out.add(key)
    return frozenset(out)


def canary_plans(
    spec: MTPInferenceSpec,
    plans: Sequence[PoolPlan],
    tuning: Mapping[str, PoolTuningStatus],
    rollback_k: Callable[[str], int | None],
    cluster_profiles: Mapping[str, int] | None,
) -> dict[str, PoolPlan]:
    """Pools running a canary trial now (2+ replicas) → the canary replica's plan."""
    out: dict[str, PoolPlan] = {}
    if spec.replicas < 2:
        return out
    for plan in plans:
        if plan.nodes > 1:  # a multi-node pool is not tuned (reconcile_plan.multi_node_tuning)
            continue
        k = canary_k(tuning.get(plan.gpu_product))
        if k is None or k == plan.k or rollback_k(plan.gpu_product) is not None:
            continue  # a rolled-back pool runs no canary: rollback wins over tuning
        try:
            out[plan.gpu_product] = plan_pool(
                spec, plan.gpu_product, cluster_profiles, rollback_k(plan.gpu_product), k
            )
        except PlanError:
            continue
    return out


def canary_unwanted(
    spec: MTPInferenceSpec,
    tuning: Mapping[str, PoolTuningStatus],
    product: str | None,
    pinned: bool,
) -> str:
    """Why a pass wants no canary for the pool of `product` (None: a canary pod that names
    no pool), for the Event that says its pod was deleted: a canary exists only while a
    live trial names it (issue 36)."""
    if product is None:
        return "it names no pool"
    if spec.speculative.tuning.mode == "Off":
        return "tuning is Off"
    if spec.replicas < 2:
        return f"replicas {spec.replicas}: a canary runs only beside 2 or more"
    if pinned:
        return "the pool is rolled back: rollback wins over tuning"
    entry = tuning.get(product)
    if entry is None or (entry.trial is None and entry.trials
                         and entry.trials[-1].outcome == "superseded"):
        return ("no trial of this spec generation names it (the spec changed: a new "
                "generation ends a trial)")
    if entry.trial is None or entry.trial.kind != "canary":
        return "no live trial names it"
    return f"its trial's K={entry.trial.k} is not one this pool runs as a canary now"


def guard_from(pool: PoolStatus, cooldown_seconds: float, now: datetime,
               alert_window: float) -> Guard:
    """Rollback's view of the pool from its status fields."""
    last_rb = parse_time(pool.last_rollback_time)
    last_alert = parse_time(pool.last_alert_time)
    return Guard(
        alert_firing=last_alert is not None
        and now - last_alert < timedelta(seconds=alert_window),
        rollback_pinned=pool.rollback_k is not None,
        cooldown_until=last_rb + timedelta(seconds=cooldown_seconds) if last_rb else None,
    )


def _measured(m: Measurement) -> dict[str, Any]:
    from datetime import UTC

    row: dict[str, Any] = {
        "k": m.k,
        "outputTokensPerSecond": round(m.output_tps, 3),
        "acceptance": [round(a, 4) for a in m.acceptance],
        "tokensPerStep": round(m.tokens_per_step, 4),
        "windowSeconds": round(m.seconds, 1),
        "windowEnd": format_time(datetime.fromtimestamp(m.end, UTC)),
        "replicas": m.replicas,
    }
    if m.concurrency is not None:
        row["concurrency"] = round(m.concurrency, 3)
    if m.request_speed is not None:
        row["requestTokensPerSecond"] = round(m.request_speed, 3)
    return row


def _fit(fit: CostFit) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": fit.describe(),
        "baseSeconds": fit.alpha,
        "perTokenSeconds": fit.beta,
        "windows": fit.points,
        "ks": list(fit.ks),
        "rmseSeconds": fit.rmse,
    }
    if fit.alpha_se is not None:
        out["baseSecondsError"] = fit.alpha_se
    if fit.beta_se is not None:
        out["perTokenSecondsError"] = fit.beta_se
    return out


def published(
    mode: str,
    decision: TuningDecision,
    table: Sequence[Measurement],
    trial: Trial | None,
    history: Sequence[Trial],
    tuned_k: int | None,
    generation: int | None,
    now: datetime,
    schedule: Sequence[tuple[int, int, int]] | None = None,
    capacity: Capacity | None = None,
) -> PoolTuningStatus:
    """status.pools[].tuning for one pool."""
    rows = sorted(table, key=lambda m: m.end)[-MAX_TUNING_ROWS:]
    ests = []
    for e in decision.estimates[:MAX_TUNING_ROWS]:
        row: dict[str, Any] = {"k": e.k, "basis": e.basis, "detail": e.detail}
        if e.output_tps is not None:
            row["outputTokensPerSecond"] = round(e.output_tps, 3)
        if e.uncertainty is not None:
            row["uncertainty"] = round(e.uncertainty, 3)
        if e.tokens_per_step is not None:
            row["tokensPerStep"] = round(e.tokens_per_step, 4)
        ests.append(row)
    out: dict[str, Any] = {
        "mode": mode,
        "reason": decision.reason,
        "measured": [_measured(m) for m in rows],
        "estimates": ests,
        "trials": [trial_status(t) for t in history[-MAX_TRIAL_HISTORY:]],
        "generation": generation,
        "updated": format_time(now),
    }
    if decision.recommended_k is not None:
        out["recommendedK"] = decision.recommended_k
    if decision.fit is not None:
        out["stepCost"] = _fit(decision.fit)
    if capacity is not None:
        cap: dict[str, Any] = {"k": capacity.k, "peakRunning": capacity.peak_running,
                               "waitingForCapacity": capacity.waiting}
        if capacity.kv_usage is not None:
            cap["kvCacheUsage"] = round(capacity.kv_usage, 4)
        if capacity.capacity is not None and capacity.headroom is not None:
            cap["estimatedCapacity"] = round(capacity.capacity, 1)
            cap["headroom"] = round(capacity.headroom, 1)
        out["capacity"] = cap
    if schedule:
        out["recommendedSchedule"] = [
            {"minBatchSize": a, "maxBatchSize": b, "numSpeculativeTokens": k}
            for a, b, k in schedule
        ]
    if trial is not None:
        out["trial"] = trial_status(trial)
    if tuned_k is not None:
        out["tunedK"] = tuned_k
    if generation is None:
        out.pop("generation")
    return PoolTuningStatus.model_validate(out)
