"""The signal both alert sources produce: an Alertmanager webhook alert or a built-in evaluation.

The three target labels are the contract between the pods' labels (relabelled by Prometheus),
the shipped rules, Alertmanager and the operator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

HIT_RATE_LOW = "MTPHitRateLow"
ERROR_PROPAGATION_HIGH = "MTPErrorPropagationHigh"
ROLLBACK_ALERTS = frozenset({HIT_RATE_LOW, ERROR_PROPAGATION_HIGH})

# Labels every rollback alert must carry to name its pool.
TARGET_LABELS = ("namespace", "mtpinference", "gpu_product")

AlertStatus = Literal["firing", "resolved"]
Via = Literal["alertmanager", "evaluator"]


@dataclass(frozen=True)
class PoolRef:
    """One GPU pool of one MTPInference."""

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

    @property
    def has_value(self) -> bool:
        return self.value is not None and math.isfinite(self.value)
