"""The MTPInference status the operator reports. Pure: observations and `now` in, the typed
status (`api.v1alpha1.MTPInferenceStatus`) out; `to_wire` is what the status writer sends."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from mtp_operator import conditions as c
from mtp_operator.api.tuning import MAX_TRIAL_HISTORY, MAX_TUNING_ROWS, PoolTuningStatus
from mtp_operator.api.v1alpha1 import (
    MAX_ROLLBACK_HISTORY,
    Condition,
    MTPInferenceStatus,
    PoolStatus,
)
from mtp_operator.lws import is_leaderworkerset, observe_leaderworkerset
from mtp_operator.naming import (
    ANNOTATION_COMMAND,
    ANNOTATION_GPU_PRODUCT,
    ANNOTATION_TRAFFIC_CLASS,
    plain_product_slug,
    pool_deployment_name,
)
from mtp_operator.planning import PoolPlan
from mtp_operator.timestamps import time_problem
from mtp_runtime.gpu_profiles import product_kind_label
from mtp_runtime.problems import Problem, problems_text
from mtp_runtime.vllm_command import MAX_SPECULATIVE_TOKENS, k_from_argv

MAX_REMOVED_POOLS = 10
# The status's size is bounded by design (issue 36; etcd refuses an object over 1.5 MiB, and
# the status shares that with metadata and spec). tests/unit/logic/test_status_size.py builds the
# worst case these bounds admit and checks it against the limit; docs/operations.md gives the
# figures.
MAX_STATUS_POOLS = 64  # pools a resource may have (GPU products x traffic classes)
MAX_FULL_POOL_ENTRIES = 16  # pool entries with their tuning report; the rest carry its state
MAX_STATUS_TEXT = 256  # characters of each free-text field (reasons, details, messages)
MAX_CONDITION_MESSAGE = 1024  # a condition's message (it lists pools)
MAX_CONDITIONS = 16
MAX_SUMMARY = 1024  # poolsSummary, tuningSummary, fitSummary, ready
MAX_FIT_ENTRIES = MAX_STATUS_POOLS
SUMMARISED_NOTE = f" [tuning report left out of status: over {MAX_FULL_POOL_ENTRIES} pools]"


@dataclass(frozen=True)
class ObservedPool:
    """What a pool Deployment says about itself."""

    desired: int
    ready: int
    up_to_date: bool  # the Deployment controller has seen and rolled out the current spec


def observe_deployment(body: Mapping[str, Any]) -> ObservedPool:
    """A pool's counts: a Deployment's replicas, or a LeaderWorkerSet's groups."""
    if is_leaderworkerset(body):
        return ObservedPool(*observe_leaderworkerset(body))
    spec, st = body.get("spec") or {}, body.get("status") or {}
    desired = int(spec.get("replicas", 1))
    generation = (body.get("metadata") or {}).get("generation", 0)
    up_to_date = (
        st.get("observedGeneration", 0) >= generation
        and st.get("updatedReplicas", 0) >= desired
        and st.get("replicas", 0) <= desired
    )
    return ObservedPool(desired, int(st.get("readyReplicas", 0)), up_to_date)


def summary_name(pool: PoolStatus) -> str:
    """A pool in `poolsSummary`: `H100`, or `H100/long` for a class pool."""
    short = short_product(pool.gpu_product)
    return short if pool.traffic_class is None else f"{short}/{pool.traffic_class}"


def short_product(product: str) -> str:
    """The POOLS column's name: the family, with a MIG slice or sharing kept visible."""
    return product_kind_label(product) or plain_product_slug(product).upper()


@dataclass
class StatusInput:
    name: str
    generation: int | None
    previous: MTPInferenceStatus  # the current status (may be empty)
    plans: Sequence[PoolPlan]  # pools that should exist now
    observed: Mapping[str, ObservedPool]  # by GPU product
    # by GPU product: the PoolStatus rollback fields to keep (snake_case; None = unset)
    rollback_state: Mapping[str, Mapping[str, Any]]
    settings_hashes: Mapping[str, str]
    problems: Sequence[Problem] = ()  # spec problems: reported, pools left as they were
    problem_reason: str = c.REASON_INVALID_SPEC  # or NoFittingNodes
    apply_error: str | None = None
    removed: Sequence[str] = field(default_factory=list)
    # pools kept as they run although no node fits them now: (status entry, PoolFate message)
    retained: Sequence[tuple[PoolStatus, str]] = ()
    tuning: Mapping[str, PoolTuningStatus] = field(default_factory=dict)  # by GPU product


def read_status(status: Mapping[str, Any] | MTPInferenceStatus | None) -> MTPInferenceStatus:
    """A status as the API server returns it (camelCase) as the typed model. A status that
    does not validate (hand-edited, or written by another version) reads as empty: the next
    write replaces it."""
    if isinstance(status, MTPInferenceStatus):
        return status
    try:
        return MTPInferenceStatus.model_validate(status or {})
    except ValidationError:
        return MTPInferenceStatus()


# The status times the operator reads back and computes with (the others are copied as
# they are): pools[]'s, and its tuning trial's and trials' (attribute: name in status).
POOL_TIMES = {"settings_since": "settingsSince", "last_rollback_time": "lastRollbackTime",
              "last_alert_time": "lastAlertTime", "product_gone_since": "productGoneSince"}
TRIAL_TIMES = {"started": "started", "ended": "ended"}


def bad_times(status: MTPInferenceStatus) -> list[str]:
    """Each status time the operator computes with that is not a usable time, named by its
    path and value with the reason (`timestamps.time_problem`). Such a value reads as absent
    (`timestamps.parse_time`), and the next status write replaces it; the caller logs these."""
    out = []

    def check(path: str, obj: Any, names: Mapping[str, str]) -> None:
        for attr, name in names.items():
            value = getattr(obj, attr)
            why = time_problem(value)
            if why is not None:
                out.append(f"{path}.{name} {value!r}: {why}; read as absent")

    for pool in status.pools:
        where = f"status.pools[{pool.gpu_product}]"
        check(where, pool, POOL_TIMES)
        if pool.tuning is None:
            continue
        if pool.tuning.trial is not None:
            check(f"{where}.tuning.trial", pool.tuning.trial, TRIAL_TIMES)
        for i, trial in enumerate(pool.tuning.trials):
            check(f"{where}.tuning.trials[{i}]", trial, TRIAL_TIMES)
    return out


def to_wire(status: MTPInferenceStatus) -> dict[str, Any]:
    """The status as the status subresource takes it: camelCase; fields never set (and
    None) left out, so a merge patch leaves what it does not name alone."""
    return status.model_dump(by_alias=True, exclude_unset=True, exclude_none=True, mode="json")


def _conditions(
    previous: MTPInferenceStatus, wanted: list[c.Want], now: str, generation: int | None
) -> list[Condition]:
    prev = [cond.model_dump(by_alias=True) for cond in previous.conditions]
    return [Condition.model_validate(d) for d in c.merge(prev, wanted, now, generation)]


def _pool_entry(i: StatusInput, plan: PoolPlan) -> PoolStatus:
    seen = i.observed.get(plan.key)
    kept = {k: v for k, v in (i.rollback_state.get(plan.key) or {}).items() if v is not None}
    if plan.traffic_class is not None:
        kept["traffic_class"] = plan.traffic_class
    return PoolStatus(
        gpu_product=plan.gpu_product,
        num_speculative_tokens=plan.k,
        source=plan.source,
        reason=plan.reason,
        replicas=seen.desired if seen else 0,
        ready_replicas=seen.ready if seen else 0,
        deployment=pool_deployment_name(i.name, plan.gpu_product, plan.traffic_class),
        settings_hash=i.settings_hashes.get(plan.key, ""),
        tuning=i.tuning.get(plan.key),
        **kept,
    )


def build_status(i: StatusInput, now: str) -> MTPInferenceStatus:
    if i.problems:
        # The spec can't be served as written: say so, and leave the pools as they were.
        message = problems_text(i.problems)
        wanted = [
            c.Want(c.DEGRADED, True, i.problem_reason, message),
            c.Want(c.PROGRESSING, False, i.problem_reason, "spec change not applied"),
        ]
        invalid = i.problem_reason == c.REASON_INVALID_SPEC
        wanted = c.with_kstatus(wanted, stalled=True)
        return i.previous.model_copy(
            update={
                "observed_generation": i.generation,
                "phase": "Invalid" if invalid else "Degraded",
                "conditions": _conditions(i.previous, wanted, now, i.generation),
            }
        )

    pools = [_pool_entry(i, p) for p in i.plans] + [e for e, _ in i.retained]
    pools.sort(key=lambda p: p.key)
    desired = sum(p.replicas for p in pools)
    ready = sum(p.ready_replicas for p in pools)
    rolling = [
        p.key for p in i.plans if p.key not in i.observed or not i.observed[p.key].up_to_date
    ]
    all_ready = bool(pools) and not rolling and ready >= desired
    rolled_back = [p for p in pools if p.source == "rollback"]

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
            f"{p.key} K={p.num_speculative_tokens} ({p.reason})" for p in rolled_back
        )
        wanted.append(c.Want(c.ROLLED_BACK, True, c.REASON_ROLLED_BACK, msg))
    else:
        wanted.append(c.Want(c.ROLLED_BACK, False, c.REASON_NOT_ROLLED_BACK))
    if i.retained:
        reasons = sorted({e.retained or "" for e, _ in i.retained})
        msg = "; ".join(f"pool {e.key}: {m}" for e, m in i.retained)
        wanted.append(c.Want(c.POOLS_RETAINED, True, reasons[0], msg))
    elif any(x.type == c.POOLS_RETAINED for x in i.previous.conditions):
        wanted.append(c.Want(c.POOLS_RETAINED, False, c.REASON_ALL_POOLS_PLACED))

    wanted = c.with_kstatus(wanted, stalled=False)  # an API error is retried, not stalled
    if i.apply_error:
        phase = "Degraded"
    elif all_ready:
        phase = "Ready"
    else:
        phase = "Progressing"
    removed = list(i.previous.removed_pools)
    removed = [r for r in removed if r not in {p.key for p in i.plans}]
    removed = (removed + [r for r in i.removed if r not in removed])[-MAX_REMOVED_POOLS:]
    return MTPInferenceStatus(
        observed_generation=i.generation,
        phase=phase,
        conditions=_conditions(i.previous, wanted, now, i.generation),
        pools=pools,
        rollbacks=list(i.previous.rollbacks),
        pools_summary=" ".join(
            f"{summary_name(p)}:{p.num_speculative_tokens}" for p in pools
        ),
        ready=f"{ready}/{desired}",
        removed_pools=removed,
        rollback_reset_token=i.previous.rollback_reset_token,
        # "" clears a summary the server still has (a merge patch leaves out what is None)
        tuning_summary=tuning_summary(pools) or ("" if i.previous.tuning_summary else None),
    )


def retained_entry(
    name: str,
    previous: PoolStatus | None,
    deployment: Mapping[str, Any],
    observed: ObservedPool,
    reason: str,
    gone_since: str | None,
) -> PoolStatus:
    """The status entry of a retained pool: what it reported last, with its live counts."""
    meta = deployment.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    live = {
        "replicas": observed.desired,
        "ready_replicas": observed.ready,
        "retained": reason,
        "product_gone_since": gone_since,
    }
    if previous is not None:
        return previous.model_copy(update=live)
    product = annotations.get(ANNOTATION_GPU_PRODUCT) or ""
    traffic_class = annotations.get(ANNOTATION_TRAFFIC_CLASS)
    k = _k_from_command(annotations.get(ANNOTATION_COMMAND))
    return PoolStatus(
        gpu_product=product,
        traffic_class=traffic_class,
        num_speculative_tokens=k,
        source="profile" if k else "off",
        reason="as the running pool was planned",
        deployment=meta.get("name") or pool_deployment_name(name, product, traffic_class),
        **live,
    )


def _k_from_command(command: str | None) -> int:
    """K from a pool's `mtp-operator.io/vllm-command` annotation (0 without speculation);
    the runtime's vllm_command owns the argv's layout."""
    try:
        argv = json.loads(command or "[]")
    except ValueError:
        return 0
    return k_from_argv(argv) if isinstance(argv, list) else 0


def tuning_summary(pools: Sequence[PoolStatus]) -> str | None:
    """`tuningSummary`: the recommended K per tuned pool (`-` while it has none yet)."""
    parts = [
        f"{summary_name(p)}:"
        f"{'-' if p.tuning.recommended_k is None else p.tuning.recommended_k}"
        for p in pools
        if p.tuning is not None
    ]
    return " ".join(parts) or None


def status_changed(
    old: MTPInferenceStatus | Mapping[str, Any], new: MTPInferenceStatus | Mapping[str, Any]
) -> bool:
    """True when writing `new` would tell the reader something `old` doesn't."""
    a = to_wire(old) if isinstance(old, MTPInferenceStatus) else dict(old)
    b = to_wire(new) if isinstance(new, MTPInferenceStatus) else dict(new)
    if {k: v for k, v in a.items() if k != "conditions"} != {
        k: v for k, v in b.items() if k != "conditions"
    }:
        return True
    return not c.same_ignoring_time(
        list(a.get("conditions") or []), list(b.get("conditions") or [])
    )


# ---- the size bound --------------------------------------------------------------------------

def cut(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, the last one an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _changed(obj: Any, /, **values: Any) -> Any:
    """`model` with the values that differ (an unchanged one stays unset: the wire form, which
    leaves unset fields out, is then the same)."""
    update = {k: v for k, v in values.items() if getattr(obj, k) != v}
    return obj.model_copy(update=update) if update else obj


def _bounded_trial(trial: Any) -> Any:
    return _changed(trial, reason=cut(trial.reason, MAX_STATUS_TEXT))


def bounded_tuning(t: PoolTuningStatus, full: bool) -> PoolTuningStatus:
    reason = t.reason[: -len(SUMMARISED_NOTE)] if t.reason.endswith(SUMMARISED_NOTE) else t.reason
    trial = None if t.trial is None else _bounded_trial(t.trial)
    trials = [_bounded_trial(x) for x in t.trials[-MAX_TRIAL_HISTORY:]]
    if not full:  # the state the operator reads back; the report is measured again
        return _changed(
            t, reason=cut(reason, MAX_STATUS_TEXT - len(SUMMARISED_NOTE)) + SUMMARISED_NOTE,
            measured=[], estimates=[], step_cost=None, capacity=None,
            recommended_schedule=None, trial=trial,
            # ended trials keep what the operator reads back (besidePool), not their cost text
            trials=[_changed(x, capacity_cost="") for x in trials],
        )
    measured = [
        _changed(m, acceptance=m.acceptance[:MAX_SPECULATIVE_TOKENS])
        for m in t.measured[-MAX_TUNING_ROWS:]
    ]
    estimates = [
        _changed(e, detail=cut(e.detail, MAX_STATUS_TEXT)) for e in t.estimates[:MAX_TUNING_ROWS]
    ]
    step_cost = t.step_cost and _changed(
        t.step_cost, model=cut(t.step_cost.model, MAX_STATUS_TEXT),
        ks=t.step_cost.ks[: MAX_SPECULATIVE_TOKENS + 1],
    )
    schedule = t.recommended_schedule
    return _changed(
        t, reason=cut(reason, MAX_STATUS_TEXT), measured=measured, estimates=estimates,
        step_cost=step_cost, trial=trial, trials=trials,
        recommended_schedule=None if schedule is None else schedule[:MAX_TUNING_ROWS],
    )


def _bounded_pool(pool: PoolStatus, full: bool) -> PoolStatus:
    return _changed(
        pool,
        reason=cut(pool.reason, MAX_STATUS_TEXT),
        retained=None if pool.retained is None else cut(pool.retained, MAX_STATUS_TEXT),
        tuning=None if pool.tuning is None else bounded_tuning(pool.tuning, full),
    )


def bounded(status: MTPInferenceStatus) -> MTPInferenceStatus:
    """`status` within the size bound: at most MAX_STATUS_POOLS pools (the planner refuses
    more, `reconcile_plan.plan_pass`), the first MAX_FULL_POOL_ENTRIES of them (in key order)
    with their tuning report and the rest with the tuning state only (mode, recommended K,
    trial, trial history, tuned K, generation: what the operator reads back; the measured table
    is in memory and measured again), every free-text field, list and summary cut to its cap.
    A status within the caps comes back as it is; bounding twice changes nothing."""
    def summary(text: str | None) -> str | None:
        return None if text is None else cut(text, MAX_SUMMARY)

    return _changed(
        status,
        conditions=[
            _changed(x, reason=cut(x.reason, MAX_STATUS_TEXT),
                     message=cut(x.message, MAX_CONDITION_MESSAGE))
            for x in status.conditions[:MAX_CONDITIONS]
        ],
        pools=[
            _bounded_pool(p, i < MAX_FULL_POOL_ENTRIES)
            for i, p in enumerate(status.pools[:MAX_STATUS_POOLS])
        ],
        rollbacks=[
            _changed(r, alert=cut(r.alert, MAX_STATUS_TEXT), reason=cut(r.reason, MAX_STATUS_TEXT))
            for r in status.rollbacks[-MAX_ROLLBACK_HISTORY:]
        ],
        fit=[_changed(f, message=cut(f.message, MAX_STATUS_TEXT))
             for f in status.fit[:MAX_FIT_ENTRIES]],
        removed_pools=status.removed_pools[-MAX_REMOVED_POOLS:],
        pools_summary=summary(status.pools_summary),
        tuning_summary=summary(status.tuning_summary),
        fit_summary=summary(status.fit_summary),
        ready=summary(status.ready),
    )
