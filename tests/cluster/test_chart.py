"""The Helm chart against the sandbox's real kube-apiserver: lint, server-side dry run of the
rendered objects, a real `helm install`, and the RBAC it grants, checked with
`kubectl auth can-i --as=system:serviceaccount:...`. The operator pod itself is only an API
object here (kwok plays its lifecycle); the lead's e2e test runs the real operator process with
the chart's ServiceAccount identity."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from support.chart import (
    CHART,
    CLUSTER_RULES,
    LEASE_RULES,
    REPO,
    rule_triples,
    template_args,
)
from support.cluster_fixtures import wait_crd_established

CRD = REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"
TOKEN = "sandbox-token-0123456789abcdef"


def _helm(sandbox, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [str(sandbox.bin("helm")), *args, "--kubeconfig", str(sandbox.kubeconfig)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out


@pytest.fixture(scope="module")
def crd(kubectl) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_crd_established(kubectl)


def test_helm_lint(sandbox) -> None:
    out = _helm(sandbox, "lint", str(CHART), "--strict")
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_template_passes_server_dry_run(sandbox, kubectl, crd, namespace) -> None:
    args = template_args(release=f"dry-{namespace}"[:40], namespace=namespace,
                         values=["alerts.tokenSecret.create=true",
                                 f"alerts.tokenSecret.token={TOKEN}", "replicaCount=2",
                                 "podDisruptionBudget.enabled=true"])
    rendered = _helm(sandbox, *args).stdout
    out = kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    for kind in ("serviceaccount", "secret", "configmap", "clusterrole.rbac.authorization.k8s.io",
                 "clusterrolebinding.rbac.authorization.k8s.io", "role.rbac.authorization.k8s.io",
                 "rolebinding.rbac.authorization.k8s.io", "service", "deployment.apps",
                 "poddisruptionbudget.policy"):
        assert f"{kind}/" in out.stdout, out.stdout


@pytest.fixture
def release(sandbox, kubectl, crd, namespace) -> Iterator[dict[str, str]]:
    """`helm install` into a fresh namespace; uninstalled afterwards (the ClusterRole and its
    binding are cluster-scoped, deleting the namespace would leave them behind)."""
    name = f"rel-{namespace[-5:]}"
    _helm(sandbox, "install", name, str(CHART), "--namespace", namespace,
          "--set", "alerts.tokenSecret.create=true", "--set", f"alerts.tokenSecret.token={TOKEN}",
          "--set", "gpuProfiles.H100=5")
    try:
        yield {"name": name, "namespace": namespace, "fullname": f"{name}-mtp-operator"}
    finally:
        _helm(sandbox, "uninstall", name, "--namespace", namespace, "--wait", check=False)


def _get(kubectl, *args: str) -> dict:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def test_helm_install_creates_the_objects(sandbox, kubectl, release) -> None:
    ns, full = release["namespace"], release["fullname"]
    status = json.loads(_helm(sandbox, "status", release["name"], "-n", ns, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    deployment = _get(kubectl, "deployment", full, "-n", ns)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/mtp-operator/mtp-operator:0.1.0"
    assert f"--lease-namespace={ns}" in container["args"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == full
    for kind, name in (("serviceaccount", full), ("service", full),
                       ("secret", f"{full}-alerts-token"),
                       ("configmap", f"{full}-settings"), ("configmap", f"{full}-dashboard"),
                       ("role", f"{full}-leader-election"),
                       ("rolebinding", f"{full}-leader-election")):
        _get(kubectl, kind, name, "-n", ns)
    _get(kubectl, "clusterrole", full)
    _get(kubectl, "clusterrolebinding", full)
    settings = _get(kubectl, "configmap", f"{full}-settings", "-n", ns)["data"]["settings.yaml"]
    assert '"H100": 5' in settings
    service = _get(kubectl, "service", full, "-n", ns)
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"alerts": 8443,
                                                                       "metrics": 8080}
    _get(kubectl, "crd", "mtpinferences.mtp-operator.io")


def test_installed_rbac_is_exactly_the_documented_set(kubectl, release) -> None:
    ns, full = release["namespace"], release["fullname"]
    assert rule_triples(_get(kubectl, "clusterrole", full)["rules"]) == CLUSTER_RULES
    assert rule_triples(_get(kubectl, "role", f"{full}-leader-election", "-n", ns)["rules"]) \
        == LEASE_RULES
    # nothing else is bound to the ServiceAccount
    subject = {"kind": "ServiceAccount", "name": full, "namespace": ns}
    bound = [b["metadata"]["name"] for b in _get(kubectl, "clusterrolebindings")["items"]
             if subject in (b.get("subjects") or [])]
    assert bound == [full]
    bound = [b["metadata"]["name"] for b in _get(kubectl, "rolebindings", "-A")["items"]
             if subject in (b.get("subjects") or [])]
    assert bound == [f"{full}-leader-election"]


def _can_i(kubectl, release, *args: str) -> bool:
    who = f"system:serviceaccount:{release['namespace']}:{release['fullname']}"
    out = kubectl("auth", "can-i", *args, f"--as={who}", check=False)
    answer = out.stdout.strip()
    assert answer in ("yes", "no"), out.stdout + out.stderr
    return answer == "yes"


ALLOWED = [
    ("watch", "mtpinferences.mtp-operator.io", "--all-namespaces"),
    ("patch", "mtpinferences.mtp-operator.io", "--subresource=status", "-n", "team-a"),
    ("create", "deployments.apps", "-n", "team-a"),
    ("delete", "deployments.apps", "-n", "team-a"),
    ("patch", "services", "-n", "team-a"),
    ("list", "nodes"),
    ("list", "pods", "--all-namespaces"),
    ("create", "events", "-n", "team-a"),
    ("create", "pods", "-n", "team-a"),  # a tuning canary (spec.speculative.tuning: Auto)
    ("delete", "pods", "-n", "team-a"),  # removed after its trial
    # traffic classes taken out of a spec: a class Service and the picker's ConfigMap are
    # read, then deleted only when the MTPInference is their controller
    ("get", "configmaps", "-n", "team-a"),
    ("delete", "configmaps", "-n", "team-a"),
    ("delete", "services", "-n", "team-a"),
]
REFUSED = [
    ("get", "secrets", "-n", "{ns}"),
    ("list", "secrets", "--all-namespaces"),
    ("list", "configmaps", "--all-namespaces"),
    ("update", "configmaps", "-n", "team-a"),
    ("update", "mtpinferences.mtp-operator.io", "-n", "team-a"),  # never writes the spec
    ("patch", "mtpinferences.mtp-operator.io", "-n", "team-a"),  # nor metadata
    ("get", "secrets", "--all-namespaces"),
    ("update", "services", "-n", "team-a"),  # applied (patch), never updated
    ("delete", "mtpinferences.mtp-operator.io", "-n", "team-a"),
    ("create", "mtpinferences.mtp-operator.io", "-n", "team-a"),
    ("update", "deployments.apps", "-n", "team-a"),
    ("update", "pods", "-n", "team-a"),  # canaries are applied (patch) and deleted, never updated
    ("patch", "nodes"),
    ("update", "leases.coordination.k8s.io", "-n", "team-a"),  # only in the release namespace
    ("list", "leases.coordination.k8s.io", "-n", "{ns}"),
    ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    ("list", "namespaces"),
]


def test_can_i_agrees(kubectl, release) -> None:
    ns = release["namespace"]
    for args in ALLOWED:
        assert _can_i(kubectl, release, *args), f"should be allowed: {args}"
    for verb in ("get", "create", "update"):
        assert _can_i(kubectl, release, verb, "leases.coordination.k8s.io", "-n", ns)
    for args in REFUSED:
        args = tuple(a.format(ns=ns) for a in args)
        assert not _can_i(kubectl, release, *args), f"should be refused: {args}"
