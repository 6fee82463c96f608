"""Real Prometheus scraping the sandbox's pool pods the way a cluster's Prometheus would.

Targets come from the file_sd list `PoolFakes(file_sd=...)` writes (the pool pods with the
`__meta_kubernetes_*` labels Kubernetes discovery would give), relabelled by the chart's own
PodMonitor relabelings (rendered with helm), so the alert labels are exactly what a real
cluster produces. Whatever serves a pod's IP (a fake or a real engine) is scraped alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from monitoring import Prometheus
from support import chart
from support.pool_fakes import sanitize_label

OUR_ALERTS = ("MTPHitRateLow", "MTPErrorPropagationHigh")
POOL_LABELS = ["namespace", "mtpinference", "gpu_product"]


def podmonitor_relabel_configs() -> list[dict[str, Any]]:
    """The chart's PodMonitor for vLLM's port `http`, as the Prometheus Operator turns it into
    a scrape config: keep the selected pods and the port, then the PodMonitor's relabelings."""
    objs = chart.render(values=["monitoring.podMonitor.enabled=true"])
    spec = chart.find(objs, "PodMonitor")["spec"]
    (endpoint,) = [e for e in spec["podMetricsEndpoints"] if e["port"] == "http"]
    out: list[dict[str, Any]] = [
        {"source_labels": [f"__meta_kubernetes_pod_label_{sanitize_label(k)}"],
         "regex": v, "action": "keep"}
        for k, v in spec["selector"]["matchLabels"].items()
    ]
    out.append({"source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": endpoint["port"], "action": "keep"})
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    for r in endpoint["relabelings"]:
        out.append({keys.get(k, k): v for k, v in r.items()})
    return out


class PodPrometheus(Prometheus):
    """Prometheus with one extra job scraping the pool pods from a file_sd list."""

    def __init__(self, file_sd: Path, relabel: list[dict[str, Any]], **kw: Any) -> None:
        super().__init__(**kw)
        self.file_sd, self.relabel = file_sd, relabel

    def config(self) -> dict[str, Any]:
        cfg = super().config()
        cfg["scrape_configs"] = [{
            "job_name": "mtp-pools",
            "metrics_path": "/metrics",
            "file_sd_configs": [{"files": [str(self.file_sd)], "refresh_interval": "1s"}],
            "relabel_configs": self.relabel,
        }]
        return cfg


def firing(prom: Prometheus) -> list[dict[str, Any]]:
    return [a for a in prom.alerts()
            if a["labels"].get("alertname") in OUR_ALERTS and a["state"] == "firing"]
