"""The operator's own Prometheus metrics (served on --metrics-address, /metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)


@dataclass(frozen=True)
class OperatorMetrics:
    reconciles: Counter = field(
        default_factory=lambda: Counter(
            "mtp_operator_reconciles_total", "Reconcile passes run.", registry=REGISTRY
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
    signal_to_patch: Histogram = field(
        default_factory=lambda: Histogram(
            "mtp_operator_rollback_seconds",
            "From receiving an alert or evaluator signal to the pool Deployment patched.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=REGISTRY,
        )
    )


OPERATOR_METRICS = OperatorMetrics()
