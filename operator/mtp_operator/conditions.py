"""Status conditions with stable lastTransitionTime. Pure: `now` is an argument.

A condition's lastTransitionTime changes only when its status changes; a new reason or
message alone keeps the old time (the Kubernetes API conventions).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
ROLLED_BACK = "SpeculationRolledBack"
# kstatus' names (Flux `wait: true`, kubectl wait): mirrors of Progressing and of a Degraded
# that only a spec change can fix.
RECONCILING = "Reconciling"
STALLED = "Stalled"
# Pools kept as they run although no node fits them now (present only once it was True).
POOLS_RETAINED = "PoolsRetained"
# Does the model fit each GPU product (spec.fit; present only with spec.fit).
MODEL_FITS = "ModelFits"
ORDER = (
    READY, PROGRESSING, DEGRADED, ROLLED_BACK, POOLS_RETAINED, MODEL_FITS, RECONCILING, STALLED
)

# Reasons, named so users and tools can match on them.
REASON_ALL_POOLS_READY = "AllPoolsReady"
REASON_POOLS_NOT_READY = "PoolsNotReady"
REASON_ROLLING_OUT = "RollingOut"
REASON_STABLE = "Stable"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_NO_FITTING_NODES = "NoFittingNodes"
REASON_APPLY_FAILED = "ApplyFailed"
REASON_HEALTHY = "Healthy"
REASON_ROLLED_BACK = "RolledBack"
REASON_NOT_ROLLED_BACK = "NotRolledBack"
REASON_NO_REPLICAS = "ScaledToZero"
REASON_ALL_POOLS_PLACED = "AllPoolsPlaced"
REASON_ALL_PRODUCTS_FIT = "AllProductsFit"
REASON_PRODUCTS_DO_NOT_FIT = "ProductsDoNotFit"


@dataclass(frozen=True)
class Want:
    type: str
    status: bool
    reason: str
    message: str = ""


def merge(
    existing: Iterable[dict[str, Any]],
    wanted: Iterable[Want],
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """Existing conditions updated to `wanted`, keeping lastTransitionTime where status holds."""
    old = {c.get("type"): c for c in existing or []}
    out: dict[str, dict[str, Any]] = {}
    for want in wanted:
        status = "True" if want.status else "False"
        prev = old.get(want.type)
        prev_status = (prev or {}).get("status")
        since = ((prev or {}).get("lastTransitionTime") if prev_status == status else None) or now
        out[want.type] = {
            "type": want.type,
            "status": status,
            "reason": want.reason,
            "message": want.message,
            "lastTransitionTime": since,
            "observedGeneration": generation,
        }
    for ctype, cond in old.items():  # keep conditions this pass says nothing about
        out.setdefault(ctype, cond)
    rank = {t: i for i, t in enumerate(ORDER)}
    return sorted(out.values(), key=lambda c: (rank.get(c["type"], len(ORDER)), c["type"]))


def with_kstatus(wanted: list[Want], stalled: bool) -> list[Want]:
    """Add kstatus' Reconciling (= Progressing) and Stalled conditions to `wanted`."""
    progressing = next(w for w in wanted if w.type == PROGRESSING)
    degraded = next(w for w in wanted if w.type == DEGRADED)
    return [
        *wanted,
        Want(RECONCILING, progressing.status, progressing.reason, progressing.message),
        Want(STALLED, stalled and degraded.status, degraded.reason, degraded.message),
    ]


def same_ignoring_time(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    strip = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in a]
    return strip == [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in b]
