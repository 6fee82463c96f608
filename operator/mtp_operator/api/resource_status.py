"""MTPInference v1alpha1, the status: conditions, pools (with their rollback and tuning
state), the fit check, rollbacks. The operator is its only writer (`mtp_operator.status`
builds it); field names are the public contract (camelCase on the wire).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mtp_operator.api.base import Model as _Model
from mtp_operator.api.tuning import PoolTuningStatus
from mtp_runtime.gpu_profiles import PoolSource

ConditionType = Literal["Ready", "Progressing", "Degraded", "SpeculationRolledBack"]


class Condition(_Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class PoolStatus(_Model):
    gpu_product: str
    num_speculative_tokens: int
    source: PoolSource
    reason: str = ""
    replicas: int = 0
    ready_replicas: int = 0
    deployment: str
    settings_hash: str = ""
    # Rollback state: kept in status so a restarted operator knows it.
    rollback_k: int | None = Field(
        None, description="K pinned by a rollback; cleared by a new spec generation or reset."
    )
    rollback_generation: int | None = None
    last_rollback_time: str | None = None
    known_good_k: int | None = Field(
        None, description="Last K that ran through the stabilization window without alerts."
    )
    settings_since: str | None = Field(None, description="When the running K was applied.")
    last_alert_time: str | None = None
    retained: str | None = Field(
        None,
        description="Why this pool is kept as it runs although no node fits it now: "
        "`NoSchedulableNode` (cordoned, NotReady, drained) or `ProductGone` (no node carries "
        "the product; removed after the operator's poolRemovalGraceSeconds).",
    )
    product_gone_since: str | None = Field(
        None, description="When no node carried this pool's GPU product any more."
    )
    tuning: PoolTuningStatus | None = Field(
        None, description="Measured K (spec.speculative.tuning)."
    )
    traffic_class: str | None = Field(
        None, description="The traffic class this pool serves (spec.speculative.classes)."
    )

    @property
    def key(self) -> str:
        """The pool's identity: the GPU product, or `product/class` (naming.pool_key)."""
        return self.gpu_product if self.traffic_class is None else (
            f"{self.gpu_product}/{self.traffic_class}"
        )
    nodes_per_replica: int | None = Field(
        None, description="Nodes one replica spans (a LeaderWorkerSet group when above 1)."
    )


FitVerdict = Literal["OneNode", "MultiNode", "DoesNotFit", "NotChecked"]


class ProductFit(_Model):
    """The fit check of one GPU product (spec.fit)."""

    gpu_product: str
    verdict: FitVerdict
    nodes_per_replica: int = 0
    gpus_per_node: int = 0
    gpu_memory_mib: int | None = None
    message: str = ""


class RollbackRecord(_Model):
    time: str
    gpu_product: str
    from_k: int
    to_k: int
    alert: str
    value: float | None = None
    threshold: float | None = None
    reason: str = ""
    via: Literal["alertmanager", "evaluator"] = "alertmanager"
    traffic_class: str | None = None  # the class pool rolled back (spec.speculative.classes)


class MTPInferenceStatus(_Model):
    observed_generation: int | None = None
    phase: Literal["Pending", "Progressing", "Ready", "Degraded", "Invalid"] | None = None
    conditions: list[Condition] = Field(default_factory=list)
    pools: list[PoolStatus] = Field(default_factory=list)
    rollbacks: list[RollbackRecord] = Field(default_factory=list)
    pools_summary: str | None = Field(None, description="Pools with their K, e.g. `H100:6 A100:4`.")
    tuning_summary: str | None = Field(
        None, description="Pools with the K tuning recommends, e.g. `H100:4 A100:4`."
    )
    ready: str | None = Field(None, description="Ready replicas over desired, over all pools.")
    rollback_reset_token: str | None = Field(
        None, description="The last `mtp-operator.io/reset-rollback` annotation value acted on."
    )
    fit: list[ProductFit] = Field(
        default_factory=list, description="Per GPU product: does the model fit (spec.fit)."
    )
    fit_summary: str | None = Field(
        None,
        description="Nodes per replica by product (`H200:1 H100:2 L40S:no`), or `not checked` "
        "without spec.fit.",
    )
    removed_pools: list[str] = Field(
        default_factory=list, description="GPU products whose pools were removed, most recent last."
    )
