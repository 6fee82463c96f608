"""Helpers for the Helm chart tests (tests/unit/deploy/test_chart_render.py,
tests/cluster/test_chart.py): where helm is, `helm template` into Python objects, and the
RBAC the operator is allowed."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "mtp-operator"
KUBE_VERSION = "1.36.3"  # the sandbox's, so renders match the cluster the tests install into
SANDBOX_BIN = Path(
    os.environ.get("MTP_SANDBOX_CACHE", Path.home() / ".cache" / "mtp-operator" / "sandbox")
) / "current"

# The documented RBAC (README "Install with Helm" / the lead's contract): (apiGroup, resource,
# verb), cluster-wide, plus the lease rules namespaced in the release namespace. Nothing else.
CLUSTER_RULES: frozenset[tuple[str, str, str]] = frozenset(
    [("mtp-operator.io", "mtpinferences", v) for v in ("list", "watch")]
    + [("mtp-operator.io", "mtpinferences/status", "patch")]
    + [("apps", "deployments", v) for v in ("list", "watch", "create", "patch", "delete")]
    + [("", "services", v) for v in ("get", "list", "watch", "create", "patch", "delete")]
    + [("leaderworkerset.x-k8s.io", "leaderworkersets", v)
       for v in ("list", "watch", "create", "patch", "delete")]
    + [("policy", "poddisruptionbudgets", v) for v in ("create", "patch", "delete")]
    + [("inference.networking.k8s.io", "inferencepools", v)
       for v in ("get", "create", "patch", "delete")]
    + [("", "configmaps", v) for v in ("get", "create", "patch", "delete")]
    + [("", "nodes", v) for v in ("list", "watch")]
    + [("", "pods", v) for v in ("list", "watch", "create", "patch", "delete")]
    + [("", "persistentvolumeclaims", v) for v in ("list", "watch")]
    + [("", "events", "create")]
    # the alert webhook's namespace opt-in (label mtp-operator.io/alert-rollback): one GET
    + [("", "namespaces", "get")]
)
LEASE_RULES: frozenset[tuple[str, str, str]] = frozenset(
    ("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")
)


def helm_binary() -> str | None:
    """$HELM, then the sandbox's cached build, then PATH."""
    for candidate in (os.environ.get("HELM"), str(SANDBOX_BIN / "helm"), shutil.which("helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def helm(*args: str, check: bool = False, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    binary = helm_binary()
    if binary is None:
        raise FileNotFoundError("helm not found: run tests/sandbox/build.sh (or set $HELM)")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout,
                          check=check, env={**os.environ, **(env or {})})


def template_args(release: str = "mtp-operator", namespace: str = "mtp-system",
                  values: Sequence[str] = (), api_versions: Iterable[str] = ()) -> list[str]:
    args = ["template", release, str(CHART), "--namespace", namespace,
            "--kube-version", KUBE_VERSION]
    for api in api_versions:
        args += ["--api-versions", api]
    for value in values:
        args += ["--set", value] if "=" in value and not value.startswith("{") else ["-f", value]
    return args


def render(release: str = "mtp-operator", namespace: str = "mtp-system", values: Sequence[str] = (),
           api_versions: Iterable[str] = ()) -> list[dict[str, Any]]:
    """`helm template` → the rendered objects; raises with helm's stderr on failure."""
    out = helm(*template_args(release, namespace, values, api_versions))
    if out.returncode != 0:
        raise AssertionError(f"helm template failed:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def rule_triples(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """RBAC rules → {(apiGroup, resource, verb)}; fails on wildcards and resourceNames."""
    out = set()
    for rule in rules:
        assert "nonResourceURLs" not in rule
        assert "resourceNames" not in rule, "resourceNames would need a matching contract"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    out.add((group, resource, verb))
    return out
