"""Fixtures shared by tests/cluster and tests/e2e (imported by their conftest.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support.operator_proc import OperatorProcess

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"


def wait_crd_established(kubectl, name: str = "mtpinferences.mtp-operator.io",
                         timeout: float = 60) -> None:
    """Until the CRD's Established condition is True. Not `kubectl wait --for=condition=...`:
    asked before the API server has written the new CRD's first conditions, kubectl fails at
    once ("accessor error: <nil> ... expected []interface{}") instead of waiting, and a jsonpath
    filter fails the same way ("<nil> is not array or slice")."""

    def established() -> bool:
        body = json.loads(kubectl("get", "crd", name, "-o", "json").stdout)
        return any(c.get("type") == "Established" and c.get("status") == "True"
                   for c in (body.get("status") or {}).get("conditions") or [])

    wait_for(established, timeout, interval=0.5, message=f"CRD {name} Established")


def install_crd(kubectl) -> None:
    """The MTPInference CRD applied (server-side) and Established."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_crd_established(kubectl)


@pytest.fixture(scope="session")
def crd_installed(kubectl) -> None:
    install_crd(kubectl)


@pytest.fixture(scope="session")
def inference_pool_crd(sandbox, kubectl) -> None:
    """The Gateway API Inference Extension's InferencePool CRD (v1.6.2, cached by
    tests/sandbox/build.sh)."""
    crd = sandbox.bin("gaie-crds") / "inference.networking.k8s.io_inferencepools.yaml"
    assert crd.is_file(), f"{crd} missing: run tests/sandbox/build.sh (make setup)"
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    wait_crd_established(kubectl, "inferencepools.inference.networking.k8s.io")


@pytest.fixture(scope="session")
def lws_controller(sandbox) -> Iterator[object]:
    """The LeaderWorkerSet controller (sigs.k8s.io/lws, tests/sandbox/lws_controller.py) with its
    CRD and webhooks, for the session; the CRD stays, the webhook configurations go with it."""
    from lws_controller import LwsController

    ctl = LwsController(sandbox)
    assert (ctl.home / "lws-manager").is_file(), \
        f"{ctl.home}/lws-manager missing: run tests/sandbox/build.sh (make setup)"
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()


@pytest.fixture
def start_operator(kubeconfig, crd_installed, tmp_path) -> Iterator[Callable[..., OperatorProcess]]:
    """start_operator(*args) → a running OperatorProcess; all are stopped after the test."""
    started: list[OperatorProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True) -> OperatorProcess:
        op = OperatorProcess(Path(kubeconfig), tmp_path / "operator", args, env)
        started.append(op)
        return op.start(ready=ready)

    yield start
    for op in started:
        op.stop()


@pytest.fixture
def operator(start_operator, namespace) -> OperatorProcess:
    """The operator watching only this test's namespace, evaluator off."""
    return start_operator("--namespace", namespace, "--no-evaluator")


def get_json(kubectl, *args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 60,
    interval: float = 0.25,
    message: str = "condition",
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {message}; last: {last!r}")
