"""The CRD's life cycle under a running operator (a private sandbox: the CRD is deleted here).

Started before the CRD exists, the operator says so in one line and `/readyz` is 503; once
the CRD is installed it serves by itself; the CRD deleted, it pauses (one line, 503); the CRD
re-installed, it serves again: no restart, no crash, no traceback."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from support.cluster_fixtures import wait_crd_established, wait_for
from support.operator_proc import OperatorProcess

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"
RESOURCE = yaml.safe_dump({
    "apiVersion": "mtp-operator.io/v1alpha1", "kind": "MTPInference",
    "metadata": {"name": "life"},
    "spec": {"model": "org/model", "gpuProducts": ["NVIDIA-H100-80GB-HBM3"]},
})


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    from sandbox import Sandbox

    sb = Sandbox(tmp_path_factory.mktemp("crd-life") / "sandbox")
    sb.up(timeout=180)
    try:
        yield sb
    finally:
        sb.down()


def _readyz(op: OperatorProcess) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(op.url("/readyz"), timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _pool_exists(sb) -> bool:
    p = sb.kubectl("get", "deployments", "-n", "default", "-l",
                   "mtp-operator.io/mtpinference=life", "-o", "name", check=False)
    return bool(p.stdout.strip())


def test_operator_follows_the_crd_being_installed_deleted_and_reinstalled(private, tmp_path):
    sb = private
    op = OperatorProcess(sb.kubeconfig, tmp_path, ["--namespace", "default", "--no-evaluator"])
    op.start(timeout=60, ready=False)
    try:
        _, text = wait_for(lambda: (r := _readyz(op))[0] == 503 and "CRD" in r[1] and r,
                                20, message="readyz 503 naming the CRD")
        assert "not served" in text

        sb.kubectl("apply", "--server-side", "-f", str(CRD))
        wait_crd_established(sb.kubectl)
        wait_for(lambda: _readyz(op)[0] == 200, 60, message="ready once the CRD is served")
        sb.kubectl("apply", "-n", "default", "-f", "-", input=RESOURCE)
        wait_for(lambda: _pool_exists(sb), 60, message="pool of the first resource")

        sb.kubectl("delete", "crd", "mtpinferences.mtp-operator.io", "--wait=true",
                   timeout=120)
        wait_for(lambda: _readyz(op)[0] == 503, 30, message="not ready without the CRD")
        assert op.proc is not None and op.proc.poll() is None  # paused, not crashed

        sb.kubectl("apply", "--server-side", "-f", str(CRD))
        wait_crd_established(sb.kubectl)
        wait_for(lambda: _readyz(op)[0] == 200, 60, message="ready again after re-install")
        # the garbage collector removed the first pool with its resource; a new one serves
        wait_for(lambda: not _pool_exists(sb), 60, message="old pool collected")
        sb.kubectl("apply", "-n", "default", "-f", "-", input=RESOURCE)
        wait_for(lambda: _pool_exists(sb), 60, message="pool after the re-install")
        assert op.proc.poll() is None
    finally:
        op.stop()
    log = op.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert log.count("is not served; waiting") == 1, log[-3000:]
    assert log.count("was deleted; paused") == 1, log[-3000:]
