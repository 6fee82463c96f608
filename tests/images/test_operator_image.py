"""The operator image, built from the Dockerfile (`make images`) and run with podman: as UID
65532 with a read-only root file system, `mtp-operator --help` works and `mtp-operator run`
reconciles an MTPInference in the sandbox."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

import support.mtpi as mtpi
from support.images import build, embedded_kubeconfig, run, wait_until
from support.operator_proc import free_port

# --passwd=false: no /etc/passwd entry added for the user, as under containerd or CRI-O
HARDENED = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--passwd=false"]


@pytest.fixture(scope="module")
def operator_image() -> str:
    return build("operator")


def test_operator_image_help_as_non_root(operator_image: str) -> None:
    out = run(operator_image, "--help", flags=["--entrypoint", "mtp-operator", *HARDENED])
    assert "usage: mtp-operator" in out.stdout and "run" in out.stdout
    ident = run(operator_image, "-c", "import os; print(os.getuid(), os.getgid())",
                flags=["--entrypoint", "python3", *HARDENED])
    assert ident.stdout.split() == ["65532", "65532"]
    # an arbitrary UID without a passwd entry (OpenShift): user name and home still resolve
    # (kopf asks for both)
    probe = "import getpass, os; print(getpass.getuser(), os.path.expanduser('~'))"
    out = run(operator_image, "-c", probe,
              flags=["--entrypoint", "python3", "--user", "1000700000:0", *HARDENED])
    assert out.stdout.split() == ["mtp-operator", "/tmp"]
    # the default entrypoint is `mtp-operator run`
    out = run(operator_image, "--help", flags=HARDENED)
    assert "usage: mtp-operator run" in out.stdout


def test_operator_image_reconciles_in_the_sandbox(
        operator_image: str, sandbox, kubectl, namespace: str, crd_installed, container,
        tmp_path: Path) -> None:
    kubeconfig = embedded_kubeconfig(sandbox.kubeconfig, tmp_path / "kubeconfig")
    port = free_port()
    op = container(operator_image, [
        "--namespace", namespace, "--no-evaluator", "--metrics-address", f"127.0.0.1:{port}",
        "--alerts-address", f"127.0.0.1:{free_port()}",
    ], flags=[*HARDENED, "-v", f"{kubeconfig}:/etc/mtp/kubeconfig:ro",
              "-e", "KUBECONFIG=/etc/mtp/kubeconfig"])

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            assert op.running(), op.logs()
            return False

    wait_until(ready, 90, "the containerised operator's /readyz", op.logs)
    mtpi.apply(kubectl, namespace, "img", model="deepseek-ai/DeepSeek-V3")
    obj = mtpi.wait_ready(kubectl, namespace, "img", timeout=90)
    deps = mtpi.deployments(kubectl, namespace, "img")
    # one pool per GPU product of the sandbox's kwok nodes, each with the K of its profile
    assert set(deps) == set(mtpi.PRODUCTS)
    assert {p["gpuProduct"] for p in obj["status"]["pools"]} == set(mtpi.PRODUCTS)
    assert op.running(), op.logs()
    assert "Traceback" not in op.logs(), op.logs()[-4000:]
