"""Alerts reach their pool for every name the API server accepts: a resource name over 63
characters is cut and hashed in the pod labels (label values are at most 63), so the alert
Prometheus and Alertmanager send carries the hashed value; the operator maps it back.

Real Prometheus 2.42 (our rules, the chart's PodMonitor relabelings over a file_sd list of the
pool pods) and Alertmanager 0.25 (bearer token) drive the real operator (`--no-evaluator`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from monitoring import Alertmanager, Prometheus
from mtp_operator.naming import label_value
from mtp_operator.rollback.rules import render_rules
from support import chart
from support.cluster_fixtures import wait_for
from support.mtpi import H100, apply, pool, resource, wait_ready
from support.operator_proc import free_port
from support.pool_fakes import PoolFakes, sanitize_label

pytestmark = pytest.mark.usefixtures("monitoring_binaries")

LONG_NAME = "a-resource-name-well-over-sixty-three-characters-long-for-label-values-x"
POOL_LABELS = ["namespace", "mtpinference", "gpu_product"]


def _relabel() -> list[dict[str, Any]]:
    """The chart's PodMonitor (port `http`) as the Prometheus Operator turns it into a scrape
    config: keep the selected pods and the port, then the PodMonitor's own relabelings."""
    spec = chart.find(chart.render(values=["monitoring.podMonitor.enabled=true"]),
                      "PodMonitor")["spec"]
    (endpoint,) = [e for e in spec["podMetricsEndpoints"] if e["port"] == "http"]
    out: list[dict[str, Any]] = [
        {"source_labels": [f"__meta_kubernetes_pod_label_{sanitize_label(k)}"],
         "regex": v, "action": "keep"}
        for k, v in spec["selector"]["matchLabels"].items()
    ]
    out.append({"source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": endpoint["port"], "action": "keep"})
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    out += [{keys.get(k, k): v for k, v in r.items()} for r in endpoint["relabelings"]]
    return out


class _PodPrometheus(Prometheus):
    def __init__(self, file_sd: Path, **kw: Any) -> None:
        super().__init__(**kw)
        self.file_sd = file_sd

    def config(self) -> dict[str, Any]:
        cfg = super().config()
        cfg["scrape_configs"] = [{
            "job_name": "mtp-pools", "metrics_path": "/metrics",
            "file_sd_configs": [{"files": [str(self.file_sd)], "refresh_interval": "1s"}],
            "relabel_configs": _relabel(),
        }]
        return cfg


def test_an_alert_for_a_resource_with_a_long_name_rolls_its_pool_back(
    kubeconfig, kubectl, namespace, start_operator, tmp_path
):
    assert len(LONG_NAME) > 63 and label_value(LONG_NAME) != LONG_NAME
    token_file = tmp_path / "token"
    token_file.write_text("long-names-token\n")
    port = free_port()
    start_operator("--namespace", namespace, "--no-evaluator",
                   "--alerts-address", f"127.0.0.1:{port}", "--alerts-token-file",
                   str(token_file))
    apply(kubectl, namespace, LONG_NAME, gpuProducts=[H100], speculative={"mtpLayers": 1},
          rollback={"cooldownSeconds": 60})
    assert wait_ready(kubectl, namespace, LONG_NAME)["status"]["pools"][0]["gpuProduct"] == H100
    file_sd = tmp_path / "pods.json"
    with (
        PoolFakes(kubeconfig, namespace, file_sd=file_sd) as fakes,
        Alertmanager(f"http://127.0.0.1:{port}/alerts", bearer_token_file=token_file,
                     group_by=["alertname", *POOL_LABELS], group_wait="1s",
                     group_interval="1s", repeat_interval="5s") as am,
        _PodPrometheus(file_sd, rules=render_rules(window="8s", for_="2s", min_drafts=20),
                       alertmanager_url=am.url) as prom,
    ):
        fakes.wait_serving({H100: 6})
        fakes.set_acceptance(H100, 0.6)
        alert = wait_for(lambda: [a for a in prom.alerts() if a["state"] == "firing"
                                  and a["labels"].get("alertname") == "MTPHitRateLow"], 60,
                         interval=0.5, message="MTPHitRateLow firing")[0]
        # what reaches the operator is the hashed label value, not the name
        assert alert["labels"]["mtpinference"] == label_value(LONG_NAME)
        t0 = time.monotonic()
        obj = wait_for(lambda: (o := resource(kubectl, namespace, LONG_NAME))["status"].get(
            "rollbacks") and o, 60, interval=0.5, message="rollback of the long-named pool")
        (record,) = obj["status"]["rollbacks"]
        assert (record["gpuProduct"], record["fromK"], record["toK"], record["via"]) == (
            H100, 6, 5, "alertmanager")
        assert pool(obj, H100)["numSpeculativeTokens"] == 5
        print(f"\nlong name: alert firing -> rollback recorded {time.monotonic() - t0:.1f}s")
