"""The Argo CD health check (charts/mtp-operator/files/argocd-health.lua) under real Lua.

Argo CD runs health scripts in gopher-lua (Lua 5.1) with the live object as the global `obj`
(JSON turned into Lua tables) and expects a table {status, message}. Here the script runs in the
Lua 5.1 and 5.4 interpreters that the `lupa` package embeds (real Lua, compiled from the
reference sources; `pip install lupa`), and, when `lua5.4` is on PATH (Debian package `lua5.4`),
also in that stand-alone interpreter, with the object passed as a Lua literal we write here.

Fixtures (tests/fixtures/argocd/*.yaml): `object` (an MTPInference as the API returns it),
`expected` ({status, message}) and `kstatus` (Flux's verdict). tests/contract/test_gitops_tools.py
runs the same fixtures under gopher-lua itself and under Flux's kstatus library.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtp_operator.api.v1alpha1 import MTPInference

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "charts" / "mtp-operator" / "files" / "argocd-health.lua"
FIXTURES = sorted((REPO / "tests" / "fixtures" / "argocd").glob("*.yaml"))
OPERATIONS = REPO / "docs" / "operations.md"
CM_KEY = "resource.customizations.health.mtp-operator.io_MTPInference"


def _fixture(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _lupa_runtime(version: str) -> Any:
    lupa = importlib.import_module(f"lupa.{version}")  # lupa is in the test extra
    return lupa.LuaRuntime(unpack_returned_tuples=True)


def _run_lupa(version: str, obj: dict[str, Any]) -> dict[str, Any]:
    lua = _lupa_runtime(version)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    # Argo CD wraps the script as a function body; `return hs` ends it.
    chunk = lua.eval(f"function() {SCRIPT.read_text()}\nend")
    result = chunk()
    return {"status": result["status"], "message": result["message"]}


def _lua_literal(value: Any) -> str:
    """A Python value (from JSON/YAML) as a Lua expression, the way Argo CD sees it."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        assert math.isfinite(value)
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid Lua escapes for our fixtures
    if isinstance(value, list):
        return "{" + ", ".join(_lua_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        items = (f"[{json.dumps(str(k))}] = {_lua_literal(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise TypeError(type(value))


def _run_lua_binary(binary: str, obj: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    program = tmp_path / "run.lua"
    program.write_text(
        f"obj = {_lua_literal(obj)}\n"
        f"local check = function()\n{SCRIPT.read_text()}\nend\n"
        "local hs = check()\n"
        'io.write(hs.status, "\\n", hs.message, "\\n")\n'
    )
    out = subprocess.run([binary, str(program)], capture_output=True, text=True, timeout=30,
                         check=True)
    status, message = out.stdout.rstrip("\n").split("\n", 1)
    return {"status": status, "message": message}


@pytest.mark.parametrize("version", ["lua51", "lua54"])
@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_health_with_lupa(fixture: Path, version: str) -> None:
    case = _fixture(fixture)
    assert _run_lupa(version, case["object"]) == case["expected"]


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_health_with_lua54_binary(fixture: Path, tmp_path: Path) -> None:
    binary = shutil.which("lua5.4")
    if binary is None:
        # `make test` installs it (tests/sandbox/install_lua.sh) and says so: then it must be here
        assert not os.environ.get("MTP_TEST_ALL_TOOLS"), "lua5.4 missing under `make test`"
        pytest.skip("lua5.4 not installed (`make lua`, or Debian: apt-get install -y lua5.4)")
    case = _fixture(fixture)
    assert _run_lua_binary(binary, case["object"], tmp_path) == case["expected"]


def test_fixtures_cover_every_outcome() -> None:
    outcomes = {_fixture(p)["expected"]["status"] for p in FIXTURES}
    assert outcomes == {"Healthy", "Progressing", "Degraded"}
    assert len(FIXTURES) >= 8


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixtures_follow_the_api(fixture: Path) -> None:
    """Fixture objects are valid MTPInference objects (status shape included)."""
    MTPInference.model_validate(_fixture(fixture)["object"])


def test_docs_document_the_argocd_cm_key() -> None:
    text = OPERATIONS.read_text()
    assert CM_KEY in text
    assert "files/argocd-health.lua" in text


WITH_CONDITIONS = [
    p for p in FIXTURES if (_fixture(p)["object"].get("status") or {}).get("conditions")]


@pytest.mark.parametrize("fixture", WITH_CONDITIONS, ids=[p.stem for p in WITH_CONDITIONS])
def test_fixtures_carry_the_operators_kstatus_conditions(fixture: Path) -> None:
    """Reconciling and Stalled in each fixture are what the operator writes beside its own
    conditions (conditions.with_kstatus), so the kstatus checks in tests/contract judge what
    the operator really sets."""
    from mtp_operator import conditions as c

    conds = {x["type"]: x for x in _fixture(fixture)["object"]["status"]["conditions"]}
    stalled = conds[c.DEGRADED]["reason"] in (c.REASON_INVALID_SPEC, c.REASON_NO_FITTING_NODES)
    wanted = [c.Want(t, conds[t]["status"] == "True", conds[t]["reason"], conds[t]["message"])
              for t in (c.PROGRESSING, c.DEGRADED)]
    for want in c.with_kstatus(wanted, stalled=stalled)[2:]:
        got = conds[want.type]
        assert (got["status"], got["reason"], got["message"]) == (
            "True" if want.status else "False", want.reason, want.message), want.type
