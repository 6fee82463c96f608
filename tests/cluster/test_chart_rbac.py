"""The real operator, running with the chart's ServiceAccount identity, reconciles end to end.

Proves the chart's RBAC is sufficient (every step succeeds under that identity) and minimal
(the kube-apiserver's audit log shows the operator used every verb the chart grants).
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

import yaml

from support.chart import CHART, helm
from support.cluster_fixtures import get_json, wait_for
from support.operator_proc import OperatorProcess, free_port
from support.pool_fakes import PoolFakes

REPO = Path(__file__).resolve().parents[2]


def _sa_kubeconfig(sandbox, kubectl, namespace: str, sa: str, path: Path) -> Path:
    token = kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "sandbox", "cluster": {
            "server": sandbox.apiserver_url,
            "certificate-authority": str(sandbox.pki / "ca.crt"),
        }}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "sandbox", "user": sa}}],
    }))
    return path


def _used(audit_log: Path, user: str, since: float) -> set[tuple[str, str, str]]:
    """(apiGroup, resource[/subresource], verb) of every request `user` made after `since`."""
    used = set()
    for line in audit_log.read_text().splitlines():
        ev = json.loads(line)
        if ev.get("user", {}).get("username") != user or "objectRef" not in ev:
            continue
        stamp = ev.get("requestReceivedTimestamp", "")
        if time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone < since - 1:
            continue
        ref = ev["objectRef"]
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        used.add((ref.get("apiGroup", ""), resource, ev["verb"]))
    return used


def _post_alert(port: int, namespace: str, name: str, product: str) -> dict:
    alert = {"status": "firing", "startsAt": datetime.now(UTC).isoformat(),
             "labels": {"alertname": "MTPHitRateLow", "namespace": namespace,
                        "mtpinference": name, "gpu_product": product},
             "annotations": {"value": "0.5", "threshold": "0.88"}}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/alerts", method="POST",
        data=json.dumps({"version": "4", "alerts": [alert]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _granted(kubectl, full: str, namespace: str) -> set[tuple[str, str, str]]:
    rules = get_json(kubectl, "clusterrole", full)["rules"]
    rules += get_json(kubectl, "role", f"{full}-leader-election", "-n", namespace)["rules"]
    return {(g, r, v) for rule in rules for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def test_operator_with_chart_identity_reconciles_and_uses_every_granted_verb(
    sandbox, kubectl, crd_installed, lws_controller, inference_pool_crd, namespace, tmp_path
):
    release = f"rbac-{uuid.uuid4().hex[:5]}"
    full = f"{release}-mtp-operator"
    helm("install", release, str(CHART), "-n", namespace, check=True,
         env={"KUBECONFIG": str(sandbox.kubeconfig)})
    granted = _granted(kubectl, full, namespace)
    # Creating through server-side apply is audited as `patch` but authorized as `create`
    # too (the API server refuses it without), so `create` never shows in the audit log.
    needs_unaudited = {g for g in granted if g[2] == "create" and g[1] != "events"}
    expected = granted - needs_unaudited
    user = f"system:serviceaccount:{namespace}:{full}"
    work = f"{namespace[:50]}-w"
    kubectl("create", "namespace", work)
    # opted in to the alert webhook: its one alert below reads the label (namespaces get)
    kubectl("label", "namespace", work, "mtp-operator.io/alert-rollback=enabled")
    alerts_port = free_port()
    started = time.time()
    op = OperatorProcess(
        _sa_kubeconfig(sandbox, kubectl, namespace, full, tmp_path / "sa.kubeconfig"),
        tmp_path / "operator",
        ["--namespace", work, "--leader-election", "--lease-namespace", namespace,
         "--lease-name", full, "--evaluator", "--evaluator-interval", "1",
         "--alerts-address", f"127.0.0.1:{alerts_port}"],
    )
    try:
        op.start()
        example = yaml.safe_load((REPO / "examples" / "deepseek-v3-auto.yaml").read_text())
        name = example["metadata"]["name"]
        kubectl("apply", "-n", work, "-f", "-", input=yaml.safe_dump(example))

        def ready():
            obj = get_json(kubectl, "mtpi", name, "-n", work)
            return obj if (obj.get("status") or {}).get("phase") == "Ready" else None

        obj = wait_for(ready, 90, message="example Ready under the chart's identity")
        # spec.fit: H200 one node (a Deployment), A100 and H100 two (LeaderWorkerSets), L40S
        # refused (leaderworkersets list, watch, create/patch)
        assert len(obj["status"]["pools"]) == 3
        assert len(get_json(kubectl, "leaderworkersets", "-n", work)["items"]) == 2
        # an alert through the webhook: the namespace's opt-in is read (namespaces get) and
        # the H200 pool rolled back
        assert _post_alert(alerts_port, work, name, "NVIDIA-H200")["changed"] == 1
        # update one pool, then drop one (patch and delete on deployments)
        example["spec"].setdefault("speculative", {})["profiles"] = {"H200": 1}
        kubectl("apply", "-n", work, "-f", "-", input=yaml.safe_dump(example))
        example["spec"]["gpuProducts"] = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"]
        kubectl("apply", "-n", work, "-f", "-", input=yaml.safe_dump(example))
        wait_for(lambda: not get_json(kubectl, "deployments", "-n", work)["items"], 60,
                 message="the pool outside gpuProducts removed")
        wait_for(ready, 60, message="Ready after the edits")
        # without spec.fit a replica is one node: the LeaderWorkerSets are deleted (delete on
        # leaderworkersets) and Deployments made in their place
        del example["spec"]["fit"]
        kubectl("apply", "-n", work, "-f", "-", input=yaml.safe_dump(example))
        wait_for(lambda: not get_json(kubectl, "leaderworkersets", "-n", work)["items"], 60,
                 message="the LeaderWorkerSets replaced by Deployments")
        # traffic classes: the InferencePool, the picker's ConfigMap and a Service per class
        # (patch), then the classes taken out: read and deleted (get, delete)
        example["spec"]["speculative"]["classes"] = [
            {"name": "short", "promptTokens": {"max": 127}, "numSpeculativeTokens": 2},
            {"name": "long", "promptTokens": {"min": 128}, "numSpeculativeTokens": 1}]
        kubectl("apply", "-n", work, "-f", "-", input=yaml.safe_dump(example))
        wait_for(lambda: get_json(kubectl, "inferencepools", "-n", work)["items"], 60,
                 message="the InferencePool of the classes")
        del example["spec"]["speculative"]["classes"]
        kubectl("apply", "-n", work, "-f", "-", input=yaml.safe_dump(example))
        wait_for(lambda: not get_json(kubectl, "inferencepools", "-n", work)["items"], 60,
                 message="the InferencePool gone with the classes")
        # measured K with a canary (pods create/patch/delete): 2 replicas, Auto, 5 s windows
        example["spec"]["replicas"] = 2
        example["spec"]["gpuProducts"] = ["NVIDIA-H100-80GB-HBM3"]
        example["spec"]["speculative"]["tuning"] = {
            "mode": "Auto", "observationSeconds": 5, "candidates": [1, 4]}
        with PoolFakes(sandbox.kubeconfig, work):
            kubectl("apply", "-n", work, "-f", "-", input=yaml.safe_dump(example))

            def trial_ended():
                pools = get_json(kubectl, "mtpi", name, "-n", work)["status"].get("pools")
                trials = ((pools or [{}])[0].get("tuning") or {}).get("trials") or []
                return any(t["kind"] == "canary" for t in trials)

            wait_for(trial_ended, 90, message="a canary trial ran under the chart's identity")
            wait_for(lambda: not [p for p in get_json(kubectl, "pods", "-n", work)["items"]
                                  if "canary" in p["metadata"]["name"]], 30,
                     message="canary pod deleted")
        # a lease renewal (update) and evaluator rounds (pod reads) are still to come
        with contextlib.suppress(TimeoutError):  # the asserts below name what is missing
            wait_for(lambda: expected <= _used(sandbox.audit_log, user, started), 60,
                     interval=1, message="every granted verb used")
    finally:
        op.stop()
        kubectl("delete", "namespace", work, "--wait=false", check=False)
        helm("uninstall", release, "-n", namespace, env={"KUBECONFIG": str(sandbox.kubeconfig)})

    used = _used(sandbox.audit_log, user, started)
    assert used, "no audit events for the operator's ServiceAccount"
    assert used <= granted, f"used but not granted: {sorted(used - granted)}"
    assert expected <= used, f"granted but never used: {sorted(expected - used)}"
