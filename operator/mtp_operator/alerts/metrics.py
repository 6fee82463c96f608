"""Counters of the Alertmanager webhook receiver (registered in the registry you pass)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from prometheus_client import CollectorRegistry, Counter

# Reasons an alert is accepted but not acted on.
IGNORED_REASONS = ("not_rollback_alert", "missing_labels", "duplicate", "unknown_target")
# Reasons a whole request is refused.
REJECTED_REASONS = ("unauthorized", "malformed", "too_large", "handler_error")


@dataclass(frozen=True)
class AlertMetrics:
    requests: Counter
    received: Counter
    ignored: Counter
    rejected: Counter
    handled: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> AlertMetrics:
        """New counters in `registry` (a private one by default: tests get fresh counts)."""
        reg = registry if registry is not None else CollectorRegistry(auto_describe=True)
        return cls(
            requests=Counter(
                "mtp_operator_alert_requests_total",
                "Webhook requests by HTTP status code.",
                ["code"],
                registry=reg,
            ),
            received=Counter(
                "mtp_operator_alerts_received_total",
                "Rollback alerts received, by alert name and status.",
                ["alertname", "status"],
                registry=reg,
            ),
            ignored=Counter(
                "mtp_operator_alerts_ignored_total",
                "Alerts accepted but not acted on, by reason.",
                ["reason"],
                registry=reg,
            ),
            rejected=Counter(
                "mtp_operator_alert_requests_rejected_total",
                "Webhook requests refused, by reason.",
                ["reason"],
                registry=reg,
            ),
            handled=Counter(
                "mtp_operator_alert_signals_handled_total",
                "Signals passed to the rollback handler, by outcome (changed/unchanged).",
                ["outcome"],
                registry=reg,
            ),
        )


@cache
def operator_alert_metrics() -> AlertMetrics:
    """The receiver's counters in the operator's registry (served on its /metrics), once."""
    from ..metrics import REGISTRY

    return AlertMetrics.create(REGISTRY)
