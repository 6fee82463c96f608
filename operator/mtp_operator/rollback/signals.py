"""The signal both alert sources produce: an Alertmanager webhook alert or a built-in evaluation.

The three target labels, and the class label of a traffic class pool, are the contract between
the pods' labels (relabelled by Prometheus), the shipped rules, Alertmanager and the operator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from ..api.v1alpha1 import ALERT_ERROR_PROPAGATION_HIGH, ALERT_HIT_RATE_LOW

HIT_RATE_LOW = ALERT_HIT_RATE_LOW
ERROR_PROPAGATION_HIGH = ALERT_ERROR_PROPAGATION_HIGH
ROLLBACK_ALERTS = frozenset({HIT_RATE_LOW, ERROR_PROPAGATION_HIGH})

# Labels every rollback alert must carry to name its pool.
TARGET_LABELS = ("namespace", "mtpinference", "gpu_product")
# The pool's traffic class (spec.speculative.classes; the pod label mtp-operator.io/traffic-
# class, relabelled): absent or empty for a pool without classes. A class pool's alert needs
# it: its pool is `product/class` (naming.pool_key), and the rules keep classes apart by it.
CLASS_LABEL = "traffic_class"
# What the rules aggregate by: one series per pool.
POOL_LABELS = (*TARGET_LABELS, CLASS_LABEL)

AlertStatus = Literal["firing", "resolved"]
Via = Literal["alertmanager", "evaluator"]


@dataclass(frozen=True)
class PoolRef:
    """One GPU pool of one MTPInference. `gpu_product` is the pool key: the product, or
    `product/class` for a traffic class pool (naming.pool_key)."""

    namespace: str
    mtpinference: str
    gpu_product: str


@dataclass(frozen=True)
class AlertSignal:
    alert: str  # MTPHitRateLow | MTPErrorPropagationHigh
    status: AlertStatus
    target: PoolRef
    value: float | None  # None (or NaN on the wire) = no data: never acted on
    threshold: float | None
    via: Via
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    fingerprint: str | None = None
    # the alert's labels as Alertmanager sent them (spec.rollback.alertMatchers); the
    # evaluator's signals carry none
    labels: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def has_value(self) -> bool:
        return self.value is not None and math.isfinite(self.value)
