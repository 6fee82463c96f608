"""examples/*.yaml against a real kube-apiserver with the CRD installed: `kubectl apply
--dry-run=server` runs the CRD's schema, defaults and CEL rules on each example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cluster_fixtures import wait_crd_established

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def crd(kubectl) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_crd_established(kubectl)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_passes_server_dry_run(crd, kubectl, namespace, path: Path) -> None:
    out = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path), "-o", "json")
    obj = json.loads(out.stdout)
    assert obj["kind"] == "MTPInference"
    assert obj["metadata"]["namespace"] == namespace
    # the API server applied the CRD's defaults
    assert obj["spec"]["rollback"]["enabled"] in (True, False)
    assert obj["spec"]["modelSource"] in ("huggingface", "modelscope")


def test_server_dry_run_really_validates(crd, kubectl, namespace) -> None:
    """The same path rejects an invalid example (K above maxSpeculativeTokens), so the checks
    above are the API server's and not a no-op."""
    bad = (REPO / "examples" / "custom-profiles.yaml").read_text().replace(
        "numSpeculativeTokens: auto", "numSpeculativeTokens: 6")
    out = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=bad, check=False)
    assert out.returncode != 0
    assert "must not exceed speculative.maxSpeculativeTokens" in out.stderr
