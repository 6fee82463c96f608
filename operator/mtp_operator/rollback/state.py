"""A resource's per-pool rollback state, read from and written back to its status. Pure.

The state lives in status.pools[] so a restarted operator still knows it. Whether a pin
still holds is `policy.effective_k`'s rule (a new spec generation or a new
`mtp-operator.io/reset-rollback` value undoes it); the known-good K survives both, since it
is what a later rollback returns to, and advances by `policy.promote_known_good`.

Rollback decisions (`policy.RollbackDecision`) are values: `with_decisions` folds them into a
status, and the reconciler, the one status writer, persists the result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from mtp_operator.api.v1alpha1 import (
    MAX_ROLLBACK_HISTORY,
    MTPInferenceStatus,
    PoolStatus,
    RollbackSpec,
)
from mtp_operator.naming import ANNOTATION_RESET_ROLLBACK
from mtp_operator.rollback.policy import (
    PoolRollbackState,
    RollbackDecision,
    effective_k,
    handled_reset_token_after,
    promote_known_good,
)


def _typed(status: MTPInferenceStatus | Mapping[str, Any]) -> MTPInferenceStatus:
    if isinstance(status, MTPInferenceStatus):
        return status
    return MTPInferenceStatus.model_validate(dict(status))


def _with_fields(pool: PoolStatus, fields: Mapping[str, Any]) -> PoolStatus:
    """`pool` with these camelCase rollback fields set (None: unset)."""
    data = {**pool.model_dump(by_alias=True), **fields}
    return PoolStatus.model_validate({k: v for k, v in data.items() if v is not None})


@dataclass(frozen=True)
class RollbackView:
    pools: Mapping[str, PoolStatus]  # by pool key (GPU product[/class]): previous entries
    handled_reset_token: str | None
    now: datetime

    def k_for(self, product: str) -> int | None:
        """The K a rollback pins this pool to, if a pin still holds."""
        pool = self.pools.get(product)
        return pool.rollback_k if pool is not None else None

    def by_product(
        self, plans: Sequence[Any], spec: RollbackSpec, mtp_layers: int | None
    ) -> dict[str, dict[str, Any]]:
        """Rollback fields (camelCase) for each planned pool (`plans`: planning.PoolPlan)."""
        out: dict[str, dict[str, Any]] = {}
        for plan in plans:
            prev = self.pools.get(plan.key)
            if prev is None:
                state = PoolRollbackState(plan.key, plan.k, plan.k, mtp_layers)
            else:
                state = PoolRollbackState.from_pool_status(prev, plan.k, mtp_layers)
            if state.current_k != plan.k or state.settings_since is None:
                state = replace(state, current_k=plan.k, settings_since=self.now)
            fields = promote_known_good(state, self.now, spec).status_fields()
            out[plan.key] = fields
        return out

    def status_extras(self) -> dict[str, Any]:
        return {"rollbackResetToken": self.handled_reset_token} if self.handled_reset_token else {}


def pool_rollback_state(
    previous_status: MTPInferenceStatus | Mapping[str, Any],
    metadata: Mapping[str, Any],
    generation: int | None,
    now: datetime,
) -> RollbackView:
    status = _typed(previous_status)
    token = (metadata.get("annotations") or {}).get(ANNOTATION_RESET_ROLLBACK)
    handled = status.rollback_reset_token
    pools: dict[str, PoolStatus] = {}
    for entry in status.pools:
        pin = effective_k(
            entry.num_speculative_tokens,
            entry.rollback_k,
            entry.rollback_generation,
            generation,
            token,
            handled,
        )
        if pin.rollback_k is None:
            entry = entry.model_copy(update={"rollback_k": None, "rollback_generation": None})
        pools[entry.key] = entry
    return RollbackView(pools, handled_reset_token_after(token, handled), now)


def with_decisions(
    status: MTPInferenceStatus, decisions: Iterable[RollbackDecision]
) -> MTPInferenceStatus:
    """`status` with each decision's pool state written into its pool entry and each
    rollback appended to `rollbacks` (the last MAX_ROLLBACK_HISTORY kept). Decisions for a
    pool the status does not list are left out."""
    pools = {p.key: p for p in status.pools}
    records = []
    for decision in decisions:
        product = decision.state.gpu_product
        if product not in pools:
            continue
        pools[product] = _with_fields(pools[product], decision.state.status_fields())
        if decision.record is not None:
            records.append(decision.record)
    if not records and all(pools[p.key] == p for p in status.pools):
        return status
    return status.model_copy(
        update={
            "pools": [pools[p.key] for p in status.pools],
            "rollbacks": (list(status.rollbacks) + records)[-MAX_ROLLBACK_HISTORY:],
        }
    )
