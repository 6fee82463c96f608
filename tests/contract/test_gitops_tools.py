"""The GitOps parts under the code GitOps tools run, on the fixtures the Lua tests use
(tests/fixtures/argocd/*.yaml).

- Argo CD: charts/mtp-operator/files/argocd-health.lua under gopher-lua
  (github.com/yuin/gopher-lua, the Lua 5.1 interpreter Argo CD embeds), opened the way Argo CD's
  Lua VM opens it: only the package, base, table and a reduced os library (no `string`), the
  object as the global `obj`, the returned table read back through gopher-json. Each fixture's
  `expected` is what Argo CD would show.
- Flux: each fixture's object under sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute, the
  library Flux's health checks (`wait: true`) use. Each fixture's `kstatus` is what kstatus'
  rules give, in their order: generation not observed -> InProgress; a Reconciling=True
  condition -> InProgress; Stalled=True -> Failed (its message); then Ready=True -> Current
  "Resource is Ready", Ready=False -> InProgress (its message); no such condition -> Current.

Both programs are built by tests/contract/gitops/build.sh from the Go module proxy (cached in
~/.cache/mtp-operator/gitops/<hash of their sources>).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GITOPS = REPO / "tests" / "contract" / "gitops"
SCRIPT = REPO / "charts" / "mtp-operator" / "files" / "argocd-health.lua"
FIXTURES = sorted((REPO / "tests" / "fixtures" / "argocd").glob("*.yaml"))


@pytest.fixture(scope="module")
def gitops_bin() -> Path:
    out = subprocess.run(["bash", str(GITOPS / "build.sh")], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, f"tests/contract/gitops/build.sh failed:\n{out.stderr}"
    return Path(out.stdout.strip().splitlines()[-1])


def _cases() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in FIXTURES]


def _run(argv: list[str], objects: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = subprocess.run(argv, input=json.dumps(objects), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    assert len(results) == len(objects)
    return results


@pytest.fixture(scope="module")
def argocd_results(gitops_bin: Path) -> list[dict[str, str]]:
    return _run([str(gitops_bin / "argocd-health"), str(SCRIPT)],
                [c["object"] for c in _cases()])


@pytest.fixture(scope="module")
def kstatus_results(gitops_bin: Path) -> list[dict[str, str]]:
    return _run([str(gitops_bin / "kstatus")], [c["object"] for c in _cases()])


@pytest.mark.parametrize("index", range(len(FIXTURES)), ids=[p.stem for p in FIXTURES])
def test_argocd_health_under_gopher_lua(index: int, argocd_results: list[dict[str, str]]) -> None:
    assert argocd_results[index] == _cases()[index]["expected"]


@pytest.mark.parametrize("index", range(len(FIXTURES)), ids=[p.stem for p in FIXTURES])
def test_flux_kstatus(index: int, kstatus_results: list[dict[str, str]]) -> None:
    assert kstatus_results[index] == _cases()[index]["kstatus"]


def test_gopher_lua_is_argo_cds_sandbox(gitops_bin: Path, tmp_path: Path) -> None:
    """The harness is as strict as Argo CD (so the fixture tests above can fail): no `string`
    library, a status outside Argo CD's six becomes Unknown, `obj` carries the object."""
    obj = [{"kind": "Healthy", "metadata": {"generation": 2}}]

    def run(script: str) -> dict[str, str]:
        path = tmp_path / "check.lua"
        path.write_text(script)
        return _run([str(gitops_bin / "argocd-health"), str(path)], obj)[0]

    uses_string = run("local s = string.format('%d', 1)\nreturn {status='Healthy', message=s}")
    assert "string" in uses_string.get("error", ""), uses_string
    assert run("return {status='Fine', message='x'}") == {
        "status": "Unknown", "message": "Lua returned an invalid health status"}
    assert run("return {status=obj.kind, message=tostring(obj.metadata.generation)}") == {
        "status": "Healthy", "message": "2"}


def test_fixtures_cover_every_kstatus_outcome() -> None:
    assert {c["kstatus"]["status"] for c in _cases()} == {"Current", "InProgress", "Failed"}
