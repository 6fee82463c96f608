"""MTPInference v1alpha1, automatic rollback: `spec.rollback` and the alerts that act on it.

Field names are the public contract (camelCase on the wire). When the operator rolls back is
`mtp_operator.rollback`; these are only the shapes and their defaults.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from mtp_operator.api.base import INT32_MAX
from mtp_operator.api.base import Model as _Model

# Defaults the rollback block starts from. MTPHitRateLow: the field report's "alert below 0.88
# for 5 m". MTPErrorPropagationHigh: 0.40 of draft tokens wasted behind an earlier rejection
# (mtp-metrics.md's curve: a healthy K=6 pool at per-position acceptance 0.8 wastes 0.39; K=4
# only passes 0.40 below acceptance 0.69, K=2 below 0.2), so it fires only when a deep draft
# chain is mostly thrown away, where stepping K down helps.
DEFAULT_MIN_HIT_RATE = 0.88
DEFAULT_MAX_ERROR_PROPAGATION_RATE = 0.40
MAX_ROLLBACK_HISTORY = 20
MAX_DURATION_SECONDS = 30 * 24 * 3600  # rollback timings: 30 days at most
# The alerts that may roll a pool back: the shipped rules' (rollback/signals.py takes the names
# from here). An alert of any other name is never a rollback signal, so spec.rollback.alertNames
# takes these two only.
ALERT_HIT_RATE_LOW = "MTPHitRateLow"
ALERT_ERROR_PROPAGATION_HIGH = "MTPErrorPropagationHigh"
RollbackAlertName = Literal["MTPHitRateLow", "MTPErrorPropagationHigh"]
ROLLBACK_ALERT_NAMES = (ALERT_HIT_RATE_LOW, ALERT_ERROR_PROPAGATION_HIGH)
# spec.rollback.alertMatchers: equality matchers on a webhook alert's labels, Prometheus label
# names (https://prometheus.io/docs/concepts/data_model/); bounded so the CEL rule on the keys
# stays within the API server's cost budget.
MAX_ALERT_MATCHERS = 16
MAX_ALERT_MATCHER_VALUE_LENGTH = 1024
LABEL_NAME_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"


class RollbackSpec(_Model):
    """When and how the operator backs a pool's speculative settings off by itself."""

    enabled: bool = Field(True, description="Roll back automatically when an alert fires.")
    min_hit_rate: float = Field(
        DEFAULT_MIN_HIT_RATE, ge=0, le=1, description="MTPHitRateLow fires below this hit rate."
    )
    max_error_propagation_rate: float = Field(
        DEFAULT_MAX_ERROR_PROPAGATION_RATE,
        ge=0,
        le=1,
        description="MTPErrorPropagationHigh fires above this error-propagation rate.",
    )
    cooldown_seconds: int = Field(
        600,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="After a rollback, further alerts for the pool are ignored this long. Keep "
        "it at least the alert's window plus its `for` (5m + 5m for the shipped rules): until "
        "then the alert still sees data from before the rollback.",
    )
    stabilization_seconds: int = Field(
        600,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="Settings that run this long without an alert become the pool's known-good.",
    )
    window_seconds: int = Field(
        300,
        ge=1,
        le=MAX_DURATION_SECONDS,
        description="Built-in evaluator: the window the figures are computed over.",
    )
    for_seconds: int = Field(
        300,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="Built-in evaluator: how long a threshold must stay crossed before acting.",
    )
    min_drafts: int = Field(
        50,
        ge=1,
        le=INT32_MAX,
        description="Built-in evaluator: fewer drafts than this in the window counts as no data.",
    )
    alert_names: list[RollbackAlertName] = Field(
        list(ROLLBACK_ALERT_NAMES),  # pydantic copies a mutable default per instance
        min_length=1,
        max_length=len(ROLLBACK_ALERT_NAMES),
        description="The alerts that may roll this resource's pools back, from the webhook and "
        "the built-in evaluator alike (default both; `enabled: false` turns rollback off).",
    )
    alert_matchers: (
        dict[str, Annotated[str, Field(max_length=MAX_ALERT_MATCHER_VALUE_LENGTH)]] | None
    ) = Field(
        None,
        max_length=MAX_ALERT_MATCHERS,
        description="Webhook alerts act only when they carry every one of these labels with "
        "exactly this value (`label: \"\"` matches an alert without the label), e.g. "
        "`{cluster: prod}`; Prometheus label names. The built-in evaluator's are not matched.",
    )

    @field_validator("alert_names")
    @classmethod
    def _unique_names(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError("must not name an alert twice")
        return names

    @field_validator("alert_matchers")
    @classmethod
    def _label_names(cls, matchers: dict[str, str] | None) -> dict[str, str] | None:
        for label in matchers or {}:
            if not re.fullmatch(LABEL_NAME_PATTERN, label):
                raise ValueError(
                    f"{label!r} is not a Prometheus label name ({LABEL_NAME_PATTERN})"
                )
        return matchers
