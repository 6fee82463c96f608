"""A resource's per-pool rollback state, read from and written back to its status. Pure.

The state lives in status.pools[] so a restarted operator still knows it. Whether a pin
still holds is `policy.effective_k`'s rule (a new spec generation or a new
`mtp-operator.io/reset-rollback` value undoes it); the known-good K survives both, since it
is what a later rollback returns to, and advances by `policy.promote_known_good`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from mtp_operator.api.v1alpha1 import RollbackSpec
from mtp_operator.naming import ANNOTATION_RESET_ROLLBACK
from mtp_operator.rollback.policy import (
    PoolRollbackState,
    effective_k,
    promote_known_good,
)


@dataclass(frozen=True)
class RollbackView:
    pools: Mapping[str, Mapping[str, Any]]  # by GPU product: previous entries, pins resolved
    handled_reset_token: str | None
    now: datetime

    def k_for(self, product: str) -> int | None:
        """The K a rollback pins this pool to, if a pin still holds."""
        return self.pools.get(product, {}).get("rollbackK")

    def by_product(
        self, plans: Sequence[Any], spec: RollbackSpec, mtp_layers: int | None
    ) -> dict[str, dict[str, Any]]:
        """Rollback fields for each planned pool (`plans`: planning.PoolPlan)."""
        out: dict[str, dict[str, Any]] = {}
        for plan in plans:
            prev = self.pools.get(plan.gpu_product)
            if prev is None:
                state = PoolRollbackState(plan.gpu_product, plan.k, plan.k, mtp_layers)
            else:
                state = PoolRollbackState.from_pool_status(prev, plan.k, mtp_layers)
            if state.current_k != plan.k or state.settings_since is None:
                state = replace(state, current_k=plan.k, settings_since=self.now)
            fields = promote_known_good(state, self.now, spec).status_fields()
            out[plan.gpu_product] = fields
        return out

    def status_extras(self) -> dict[str, Any]:
        return {"rollbackResetToken": self.handled_reset_token} if self.handled_reset_token else {}


def pool_rollback_state(
    previous_status: Mapping[str, Any],
    metadata: Mapping[str, Any],
    generation: int | None,
    now: datetime,
) -> RollbackView:
    token = (metadata.get("annotations") or {}).get(ANNOTATION_RESET_ROLLBACK)
    handled = previous_status.get("rollbackResetToken")
    pools: dict[str, dict[str, Any]] = {}
    for entry in previous_status.get("pools") or []:
        kept = dict(entry)
        pin = effective_k(
            entry.get("numSpeculativeTokens", 0),
            entry.get("rollbackK"),
            entry.get("rollbackGeneration"),
            generation,
            token,
            handled,
        )
        if pin.rollback_k is None:
            kept.pop("rollbackK", None)
            kept.pop("rollbackGeneration", None)
        pools[entry["gpuProduct"]] = kept
    new_token = token if token and token != handled else handled
    return RollbackView(pools, new_token, now)

