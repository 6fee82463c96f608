"""The operator's own Prometheus metrics (served on --metrics-address, /metrics): the
reconciler's and rollback's counters, and the Alertmanager webhook receiver's."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)


@dataclass(frozen=True)
class OperatorMetrics:
    reconciles: Counter = field(
        default_factory=lambda: Counter(
            "mtp_operator_reconciles_total",
            "Reconcile passes done (counted at the end of each).",
            registry=REGISTRY,
        )
    )
    deployment_writes: Counter = field(
        default_factory=lambda: Counter(
            "mtp_operator_deployment_writes_total",
            "Pool Deployments created or updated.",
            registry=REGISTRY,
        )
    )
    status_writes: Counter = field(
        default_factory=lambda: Counter(
            "mtp_operator_status_writes_total", "MTPInference status patches.", registry=REGISTRY
        )
    )
    rollbacks: Counter = field(
        default_factory=lambda: Counter(
            "mtp_operator_rollbacks_total",
            "Automatic rollbacks of a pool's speculative settings.",
            ["namespace", "mtpinference", "gpu_product", "alert"],
            registry=REGISTRY,
        )
    )
    task_failures: Counter = field(
        default_factory=lambda: Counter(
            "mtp_operator_task_failures_total",
            "Background tasks (evaluator, resync, kopf) that crashed or stopped and were "
            "restarted.",
            ["task"],
            registry=REGISTRY,
        )
    )
    evaluator_scrapes: Counter = field(
        default_factory=lambda: Counter(
            "mtp_operator_evaluator_scrapes_total",
            "The built-in evaluator's scrapes of pool pods' vLLM /metrics, by result "
            "(ok, failed).",
            ["namespace", "mtpinference", "gpu_product", "result"],
            registry=REGISTRY,
        )
    )
    signal_to_patch: Histogram = field(
        default_factory=lambda: Histogram(
            "mtp_operator_rollback_seconds",
            "From receiving an alert or evaluator signal to the pool Deployment patched.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=REGISTRY,
        )
    )


OPERATOR_METRICS = OperatorMetrics()

GC_SECONDS = Counter(
    "mtp_operator_gc_seconds_total",
    "CPU seconds Python's cyclic garbage collector took (in the thread it interrupted), by "
    "generation (2: the full passes, which walk every object not frozen; control/heap.py).",
    ["generation"],
    registry=REGISTRY,
)


@cache
def count_gc_seconds() -> None:
    """Time every collection into GC_SECONDS (once per process): the collector runs inside
    whatever allocates, so a profiler shows its time as the caller's."""
    started: list[float] = []
    children = {g: GC_SECONDS.labels(generation=str(g)) for g in range(3)}

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [time.thread_time()]
        elif started:
            children[info["generation"]].inc(time.thread_time() - started.pop())

    gc.callbacks.append(callback)


# Reasons an alert is accepted but not acted on.
IGNORED_REASONS = (
    "not_rollback_alert",
    "missing_labels",
    "impossible_value",
    "stale",  # began (firing) or ended (resolved) longer ago than the alert age bound
    "already_ended",  # firing, but its endsAt is already past
    "duplicate",
    "unknown_target",
)
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
    return AlertMetrics.create(REGISTRY)
