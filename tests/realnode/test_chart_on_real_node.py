"""`helm install` of charts/mtp-operator for real: the operator image (built by `make images`)
runs in a pod on the sandbox's real kubelet node, passes its own probes, talks to the API
server with its ServiceAccount through the in-cluster config, takes an alert with the token
from its mounted Secret; with 2 replicas on two real nodes one leads and the other takes over
when the leader's pod is killed; `helm upgrade` and `helm uninstall` leave nothing behind.

The sandbox has no kube-proxy, and its real nodes' pod network does not reach the API server
(which listens on this host's loopback), so the values are the ones a cluster whose pod
network cannot reach the API server needs: hostNetwork, listenAddress "$(POD_IP)" (the
node's IP: 127.0.0.1 and 127.0.0.2), and KUBERNETES_SERVICE_HOST/PORT pointing at the API
server's own address (its serving certificate covers 127.0.0.1), through extraEnv.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

import support.mtpi as mtpi
from realnode import LABEL, TOLERATION, RealNode
from support.chart import CHART, helm
from support.cluster_fixtures import get_json, wait_for
from support.images import build
from support.operator_proc import free_port

TOKEN = "real-node-webhook-" + uuid.uuid4().hex
RELEASE = "mtpo"
INSTANCE = {"app.kubernetes.io/instance": RELEASE}
# what the chart creates (kind, namespaced)
CHART_KINDS = [("deployments", True), ("replicasets", True), ("pods", True),
               ("services", True), ("serviceaccounts", True), ("configmaps", True),
               ("secrets", True), ("roles", True), ("rolebindings", True),
               ("poddisruptionbudgets", True), ("clusterroles", False),
               ("clusterrolebindings", False)]


def _port_free_on_both() -> int:
    import socket

    while True:
        port = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.2", port))
            return port
        except OSError:
            continue


class Release:
    def __init__(self, sandbox, kubectl, tmp: Path) -> None:
        self.sb, self.kubectl = sandbox, kubectl
        suffix = uuid.uuid4().hex[:5]
        self.ns = f"mtp-system-{suffix}"
        self.apps = f"apps-{suffix}"
        self.alerts_port = _port_free_on_both()
        self.metrics_port = _port_free_on_both()
        self.values = tmp / "values.yaml"
        self.env = {**sandbox.env(), "HELM_CACHE_HOME": str(tmp / "helm-cache"),
                    "HELM_CONFIG_HOME": str(tmp / "helm-config"),
                    "HELM_DATA_HOME": str(tmp / "helm-data")}

    def write_values(self, image: str) -> None:
        repository, tag = image.rsplit(":", 1)
        api_port = urllib.parse.urlsplit(self.sb.apiserver_url).port
        self.values.write_text(yaml.safe_dump({
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "hostNetwork": True,
            "listenAddress": "$(POD_IP)",
            "nodeSelector": {LABEL: "true"},
            "tolerations": [TOLERATION],
            "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                         {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)}],
            "watchNamespaces": [self.apps],
            "evaluator": {"enabled": False},
            "alerts": {"port": self.alerts_port,
                       "tokenSecret": {"create": True, "token": TOKEN}},
            "metrics": {"port": self.metrics_port},
        }))

    def helm(self, *args: str, timeout: float = 300) -> str:
        out = helm(*args, "--namespace", self.ns, "--kubeconfig", str(self.sb.kubeconfig),
                   timeout=timeout, env=self.env)
        assert out.returncode == 0, f"helm {args[0]} failed:\n{out.stderr}\n{out.stdout}"
        return out.stdout

    def pods(self) -> list[dict[str, Any]]:
        items = get_json(self.kubectl, "pods", "-n", self.ns, "-l",
                         "app.kubernetes.io/instance=" + RELEASE)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def ready_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods() if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", []))]

    def lease_holder(self) -> str | None:
        lease = self.kubectl("get", "lease", "mtp-operator", "-n", self.ns, "-o", "json",
                             check=False)
        if lease.returncode:
            return None
        return json.loads(lease.stdout)["spec"].get("holderIdentity")

    def post_alert(self, host: str, body: bytes, token: str) -> int:
        req = urllib.request.Request(
            f"http://{host}:{self.alerts_port}/alerts", data=body, method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def leftovers(self) -> dict[str, list[str]]:
        found = {}
        for kind, namespaced in CHART_KINDS:
            where = ["-n", self.ns] if namespaced else []
            items = get_json(self.kubectl, kind, *where, "-l",
                             f"app.kubernetes.io/instance={RELEASE}")["items"]
            if items:
                found[kind] = [i["metadata"]["name"] for i in items]
        return found


def alert_body(namespace: str, name: str, product: str) -> bytes:
    now = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    alert = {"status": "firing",
             "labels": {"alertname": "MTPHitRateLow", "namespace": namespace,
                        "mtpinference": name, "gpu_product": product, "severity": "warning"},
             "annotations": {"summary": "MTP hit rate low", "value": "0.61",
                             "threshold": "0.88"},
             "startsAt": now, "endsAt": "0001-01-01T00:00:00Z",
             "generatorURL": "http://prometheus.example/graph", "fingerprint": "0123456789abcdef"}
    return json.dumps({"version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0,
                       "status": "firing", "receiver": "mtp-operator", "groupLabels": {},
                       "commonLabels": {}, "commonAnnotations": {},
                       "externalURL": "http://alertmanager.example",
                       "alerts": [alert]}).encode()


@pytest.fixture(scope="module")
def operator_image(real_node) -> str:
    image = build("operator")
    real_node.load_image(image)
    return image


@pytest.fixture(scope="module")
def release(sandbox, kubectl, real_node, operator_image, crd_installed, tmp_path_factory):
    r = Release(sandbox, kubectl, tmp_path_factory.mktemp("chart"))
    kubectl("create", "namespace", r.apps)
    kubectl("label", "namespace", r.apps, "mtp-operator.io/alert-rollback=enabled")
    r.write_values(operator_image)
    try:
        r.helm("install", RELEASE, str(CHART), "-f", str(r.values), "--create-namespace",
               "--wait", "--timeout", "180s")
        yield r
    finally:
        _uninstall(r, sandbox, kubectl)


def _uninstall(r: Release, sandbox, kubectl) -> None:
    helm("uninstall", RELEASE, "--namespace", r.ns, "--kubeconfig", str(sandbox.kubeconfig),
         "--wait", env=r.env)
    for ns in (r.apps, r.ns):
        kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def test_operator_pod_ready_reconciles_and_takes_alerts(release: Release, kubectl, sandbox,
                                                        real_node) -> None:
    (pod,) = release.ready_pods()  # helm --wait: Ready through its own probes
    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["spec"]["hostNetwork"] is True
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] and status["restartCount"] == 0, status
    assert release.lease_holder() == pod["metadata"]["name"]

    # reconciles with its ServiceAccount through the in-cluster config
    mtpi.apply(kubectl, release.apps, "dsv3", speculative={"mtpLayers": 1})
    obj = mtpi.wait_ready(kubectl, release.apps, "dsv3", timeout=120)
    assert mtpi.pool_ks(obj)[mtpi.H100] == 6
    sa = f"system:serviceaccount:{release.ns}:{pod['spec']['serviceAccountName']}"
    writes = [e for e in _audit(sandbox) if e.get("user", {}).get("username") == sa
              and e.get("objectRef", {}).get("subresource") == "status"
              and e.get("objectRef", {}).get("resource") == "mtpinferences"]
    assert writes, f"no status write by {sa} in the audit log"
    assert all(e["sourceIPs"] == ["127.0.0.1"] for e in writes)

    # an alert on its port, with the token from the Secret the pod mounts
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "alerts-token"]
    secret = get_json(kubectl, "secret", volume["secret"]["secretName"], "-n", release.ns)
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert token == TOKEN
    body = alert_body(release.apps, "dsv3", mtpi.H100)
    assert release.post_alert(real_node.ip, body, "wrong-" + token) == 401
    assert release.post_alert(real_node.ip, body, token) == 200
    obj = mtpi.resource(kubectl, release.apps, "dsv3")
    assert [(r["gpuProduct"], r["toK"], r["via"]) for r in obj["status"]["rollbacks"]] == [
        (mtpi.H100, 5, "alertmanager")]


def _audit(sandbox) -> list[dict[str, Any]]:
    return [json.loads(line) for line in sandbox.audit_log.read_text().splitlines() if line]


def test_two_replicas_one_leads_and_the_other_takes_over(release: Release, kubectl, sandbox,
                                                         operator_image) -> None:
    second = RealNode(sandbox, 1).start()
    try:
        second.load_image(operator_image)
        release.helm("upgrade", RELEASE, str(CHART), "-f", str(release.values),
                     "--set", "replicaCount=2")
        pods = wait_for(lambda: len(p := release.pods()) == 2 and all(
            x.get("status", {}).get("containerStatuses", [{}])[0].get("started")
            for x in p) and p, 120, message="two operator pods running")
        assert {p["spec"]["nodeName"] for p in pods} == {"mtp-real-0", "mtp-real-1"}
        # one leads (Ready: readiness follows the Lease), the other waits
        time.sleep(10)  # two readiness periods
        (leader,) = release.ready_pods()
        assert release.lease_holder() == leader["metadata"]["name"]
        (standby,) = [p for p in release.pods() if p["metadata"]["name"] !=
                      leader["metadata"]["name"]]

        # the leader's node takes no new pod for now, so the pod that takes over is the
        # standby, not the Deployment's replacement for the killed one
        leader_node = leader["spec"]["nodeName"]
        kubectl("cordon", leader_node)
        try:
            kubectl("delete", "pod", leader["metadata"]["name"], "-n", release.ns,
                    "--grace-period=0", "--force")
            wait_for(lambda: release.lease_holder() == standby["metadata"]["name"], 90,
                     message="the standby to take the Lease over")
            wait_for(lambda: [p["metadata"]["name"] for p in release.ready_pods()] ==
                     [standby["metadata"]["name"]], 60, message="the new leader Ready")
            # it acts: a new resource is reconciled by the new leader
            mtpi.apply(kubectl, release.apps, "after-failover", speculative={"mtpLayers": 1})
            mtpi.wait_ready(kubectl, release.apps, "after-failover", timeout=120)
        finally:
            kubectl("uncordon", leader_node)
        # the Deployment replaced the killed pod, which now waits as the standby
        wait_for(lambda: len(release.pods()) == 2, 120, message="the replacement pod")
        time.sleep(10)
        assert [p["metadata"]["name"] for p in release.ready_pods()] == [
            standby["metadata"]["name"]]

        release.helm("upgrade", RELEASE, str(CHART), "-f", str(release.values),
                     "--set", "replicaCount=1", "--wait", "--timeout", "120s")
        wait_for(lambda: len(release.pods()) == 1, 90, message="one replica after upgrade")
    finally:
        second.stop()
    assert not second.leftovers()


def test_uninstall_leaves_no_orphans(release: Release, kubectl, sandbox, real_node) -> None:
    release.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    # the pod goes after its grace period (30 s) and the garbage collector's cascade
    # (Deployment -> ReplicaSet -> Pod); in a full loaded run that took over 60 s once
    wait_for(lambda: not release.leftovers(), 150,
             message=f"nothing of the release left: {release.leftovers()}")
    # the operator's containers are gone from the node too
    wait_for(lambda: not real_node.ctr("tasks", "ls", "-q").stdout.split(), 60,
             message="no container left running on the real node")
    # the CRD stays (Helm never deletes CRDs from crds/); the user's resources and their pool
    # Deployments stay with them
    assert kubectl("get", "crd", "mtpinferences.mtp-operator.io", check=False).returncode == 0
    assert mtpi.deployments(kubectl, release.apps, "dsv3")
