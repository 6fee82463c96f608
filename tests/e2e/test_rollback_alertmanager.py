"""Automatic rollback through real Prometheus and Alertmanager, end to end on the sandbox.

- Prometheus 2.42 loads OUR rules (`render_rules` with short windows) and scrapes the pool
  pods (`support.pod_prometheus`): targets come from a file_sd list of the pods with the
  `__meta_kubernetes_*` labels Kubernetes discovery would give, relabelled by the chart's own
  PodMonitor relabelings (rendered with helm), so the alert labels are exactly what a real
  cluster produces.
- Each pod IP (kwok: loopback) has a `FakeVLLM` on port 8000 with vLLM 0.33.0's metrics.
- Alertmanager 0.25 routes MTPHitRateLow/MTPErrorPropagationHigh to the operator's webhook
  with the bearer token from a file, send_resolved, short group/repeat intervals.
- The real operator (`--no-evaluator`): only Alertmanager can make it act.
"""

from __future__ import annotations

import time

import pytest

from monitoring import Alertmanager
from mtp_operator.rollback.rules import render_rules
from support.cluster_fixtures import wait_for
from support.mtpi import (
    ANNOTATION_RESET,
    H100,
    apply,
    check_one_pool_rolled_back,
    condition,
    deployments,
    metric,
    pool,
    pool_ks,
    resource,
    settings_hashes,
    wait_ready,
)
from support.operator_proc import free_port
from support.pod_prometheus import (
    OUR_ALERTS,
    POOL_LABELS,
    PodPrometheus,
    firing,
    podmonitor_relabel_configs,
)
from support.pool_fakes import PoolFakes, PoolWatch

pytestmark = pytest.mark.usefixtures("monitoring_binaries")

WINDOW, FOR = "8s", "2s"  # rule window and `for`, instead of the shipped 5m/5m
MIN_DRAFTS = 20
ROLLBACK = {"cooldownSeconds": 20, "stabilizationSeconds": 3}
HEALTHY, DEGRADED = 0.95, 0.6


def test_alertmanager_rolls_back_only_the_degraded_pool_and_holds_until_reset(
    kubeconfig, kubectl, namespace, start_operator, tmp_path
):
    token_file = tmp_path / "alerts-token"
    token_file.write_text("e2e-secret-token\n")
    alerts_port = free_port()
    op = start_operator(
        "--namespace", namespace, "--no-evaluator",
        "--alerts-address", f"127.0.0.1:{alerts_port}", "--alerts-token-file", str(token_file),
    )
    apply(kubectl, namespace, "dsv3", speculative={"mtpLayers": 1}, rollback=ROLLBACK)
    obj = wait_ready(kubectl, namespace, "dsv3")
    ks = pool_ks(obj)
    assert ks[H100] == 6 and len(ks) == 4, ks
    spec_before, generation = obj["spec"], obj["metadata"]["generation"]
    rules = render_rules(window=WINDOW, for_=FOR, min_drafts=MIN_DRAFTS)
    assert f"[{WINDOW}]" in rules and "[5m]" not in rules

    file_sd = tmp_path / "pool-pods.json"
    with (
        PoolWatch(kubeconfig, namespace) as watch,
        PoolFakes(kubeconfig, namespace, file_sd=file_sd) as fakes,
        Alertmanager(
            f"http://127.0.0.1:{alerts_port}/alerts",
            bearer_token_file=token_file,
            group_by=["alertname", *POOL_LABELS],
            group_wait="1s", group_interval="1s", repeat_interval="5s", send_resolved=True,
        ) as am,
        PodPrometheus(file_sd, podmonitor_relabel_configs(), rules=rules,
                      alertmanager_url=am.url) as prom,
    ):
        fakes.wait_serving(ks)
        hashes = settings_hashes(deployments(kubectl, namespace))
        # Scraped through the PodMonitor's relabelings: one healthy figure per pool.
        hit = wait_for(lambda: len(r := prom.query("mtp:hit_rate:ratio")) == 4 and r, 30,
                       message="hit rate of all 4 pools")
        for series in hit:
            labels = series["metric"]
            assert {k: labels[k] for k in POOL_LABELS} == {
                "namespace": namespace, "mtpinference": "dsv3",
                "gpu_product": labels["gpu_product"]}
            assert float(series["value"][1]) > 0.88, series
        assert {s["metric"]["gpu_product"] for s in hit} == set(ks)
        assert not firing(prom)

        t0 = time.monotonic()
        fakes.set_acceptance(H100, DEGRADED)
        alert = wait_for(lambda: firing(prom), 40, interval=0.2, message="alert firing")[0]
        t_fire = time.monotonic()
        change = watch.wait(lambda c: c.product == H100, after=t0, timeout=30)
        fakes.set_acceptance(H100, HEALTHY)  # the K=5 pods serve well
        assert alert["labels"]["gpu_product"] == H100
        assert {a["labels"]["gpu_product"] for a in firing(prom)} <= {H100}
        assert change.k == 5
        assert change.t - t0 < 30

        check_one_pool_rolled_back(kubectl, namespace, "dsv3", H100, ks=ks, hashes=hashes,
                                   to_k=5, via="alertmanager", spec_before=spec_before,
                                   generation=generation)
        assert metric(op, "mtp_operator_alert_requests_total", code="200") >= 1
        assert metric(op, "mtp_operator_alert_requests_rejected_total") == 0
        assert metric(op, "mtp_operator_rollbacks_total") == 1
        wait_for(lambda: metric(op, "mtp_operator_rollback_seconds_count") == 1, 10,
                 message="receive->patch observed")
        print(f"\nalertmanager path: degradation -> alert firing {t_fire - t0:.2f}s, "
              f"-> H100 Deployment patched {change.t - t0:.2f}s; operator receive -> patch "
              f"{metric(op, 'mtp_operator_rollback_seconds_sum'):.3f}s")

        # Recovered: the alert resolves, Alertmanager says so, and nothing flaps through the
        # cooldown and a few scrape/evaluation cycles past it.
        fakes.wait_serving({**ks, H100: 5})
        wait_for(lambda: not [a for a in prom.alerts()
                              if a["labels"].get("alertname") in OUR_ALERTS], 40,
                 interval=0.5, message="alerts resolved in Prometheus")
        wait_for(lambda: metric(op, "mtp_operator_alerts_received_total", status="resolved"),
                 30, message="resolved notification at the operator")
        wait_for(lambda: time.monotonic() > change.t + ROLLBACK["cooldownSeconds"],
                 ROLLBACK["cooldownSeconds"] + 5, interval=0.5, message="cooldown over")
        scrapes = fakes.scrapes(product=H100)
        wait_for(lambda: fakes.scrapes(product=H100) >= scrapes + 3, 20,
                 message="3 more scrapes")
        assert not firing(prom)
        assert watch.since(change.t) == [], "pools changed again after the rollback"
        obj = resource(kubectl, namespace, "dsv3")
        assert len(obj["status"]["rollbacks"]) == 1
        assert pool(obj, H100)["numSpeculativeTokens"] == 5
        assert metric(op, "mtp_operator_rollbacks_total") == 1

        kubectl("annotate", "mtpi", "dsv3", "-n", namespace, "example.com/poke=1")
        wait_for(lambda: pool(resource(kubectl, namespace, "dsv3"), H100).get("knownGoodK")
                 == 5, 15, message="knownGoodK=5")

        # Reset: the spec's K comes back for H100 only.
        t1 = time.monotonic()
        kubectl("annotate", "mtpi", "dsv3", "-n", namespace, f"{ANNOTATION_RESET}=r1")
        back = watch.wait(lambda c: c.product == H100, after=t1, timeout=20)
        assert back.k == 6
        obj = wait_for(lambda: (o := resource(kubectl, namespace, "dsv3"))["status"].get(
            "rollbackResetToken") == "r1" and o, 10, message="reset handled")
        assert pool_ks(obj) == ks
        assert condition(obj, "SpeculationRolledBack")["status"] == "False"
        assert settings_hashes(deployments(kubectl, namespace)) == hashes
        assert {c.product for c in watch.since(t0)} == {H100}
        assert obj["spec"] == spec_before and obj["metadata"]["generation"] == generation
