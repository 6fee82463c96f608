"""The import-layer contract of pyproject.toml ([tool.importlinter]), checked by import-linter.

Arrows point down only: cli > app > control > adapters > pure logic (package root,
rollback/, tuning/) > api; pure logic does no I/O; no cycles; mtp_runtime stands alone;
rollback/ and tuning/ are independent of each other; the operator imports only the runtime's
pure modules, and those do no I/O. The other tests run the same contracts over a copy of the
packages with one bad import each, so a contract that stopped seeing imports would fail here
too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
CONTRACTS = {
    c["id"]: c
    for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
}


def lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The two packages copied to tmp_path (found first on PYTHONPATH)."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "operator" / "mtp_operator", tmp_path / "mtp_operator", ignore=ignore)
    shutil.copytree(REPO / "runtime" / "mtp_runtime", tmp_path / "mtp_runtime", ignore=ignore)
    return tmp_path


def test_the_import_contracts_hold(tmp_path: Path) -> None:
    proc = lint_imports(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "7 kept, 0 broken" in proc.stdout, proc.stdout


def test_an_unchanged_copy_passes(copy: Path) -> None:
    proc = lint_imports(copy, copy)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_arrow_up_is_reported(copy: Path) -> None:
    with (copy / "mtp_operator" / "rollback" / "signals.py").open("a") as f:
        f.write("\nfrom mtp_operator.control import reconciler  # noqa\n")
    proc = lint_imports(copy, copy)
    assert proc.returncode != 0
    assert "mtp_operator.rollback is not allowed to import mtp_operator.control" in proc.stdout
    assert "mtp_operator.rollback is not allowed to import asyncio" in proc.stdout  # I/O too


def test_a_module_without_a_layer_is_reported(copy: Path) -> None:
    (copy / "mtp_operator" / "helpers.py").write_text('"""not given a layer"""\n')
    proc = lint_imports(copy, copy)
    assert proc.returncode != 0
    assert "mtp_operator.helpers" in proc.stdout, proc.stdout


def test_the_runtime_importing_the_operator_is_reported(copy: Path) -> None:
    with (copy / "mtp_runtime" / "vllm_command.py").open("a") as f:
        f.write("\nimport mtp_operator.naming  # noqa\n")
    proc = lint_imports(copy, copy)
    assert proc.returncode != 0
    assert "mtp_runtime is not allowed to import mtp_operator" in proc.stdout, proc.stdout


ROLLBACK_TUNING = CONTRACTS["rollback-tuning-independent"]["name"]
OPERATOR_PURE_RUNTIME = CONTRACTS["operator-imports-pure-runtime"]["name"]
RUNTIME_PURE = CONTRACTS["runtime-pure"]["name"]


@pytest.mark.parametrize(
    ("module", "line", "contract", "message"),
    [
        ("mtp_operator/tuning/decision.py", "from mtp_operator.rollback import policy",
         ROLLBACK_TUNING, "mtp_operator.tuning is not allowed to import mtp_operator.rollback"),
        ("mtp_operator/rollback/policy.py", "from mtp_operator.tuning import schedule",
         ROLLBACK_TUNING, "mtp_operator.rollback is not allowed to import mtp_operator.tuning"),
        ("mtp_operator/adapters/scrape.py", "from mtp_runtime import engine",
         OPERATOR_PURE_RUNTIME, "mtp_operator is not allowed to import mtp_runtime.engine"),
        ("mtp_operator/planning.py", "import mtp_runtime.launcher",
         OPERATOR_PURE_RUNTIME, "mtp_operator is not allowed to import mtp_runtime.launcher"),
        ("mtp_runtime/vllm_command.py", "import subprocess",
         RUNTIME_PURE, "mtp_runtime.vllm_command is not allowed to import subprocess"),
        ("mtp_runtime/spec_decode.py", "import urllib.request",
         RUNTIME_PURE, "mtp_runtime.spec_decode is not allowed to import urllib"),
        ("mtp_runtime/exposition.py", "import socket",
         RUNTIME_PURE, "mtp_runtime.exposition is not allowed to import socket"),
        ("mtp_runtime/figures.py", "import http.client",
         RUNTIME_PURE, "mtp_runtime.figures is not allowed to import http"),
        ("mtp_runtime/pool_config.py", "from mtp_runtime import gpu_detect",
         RUNTIME_PURE, "mtp_runtime.pool_config is not allowed to import mtp_runtime.gpu_detect"),
    ],
    ids=["tuning>rollback", "rollback>tuning", "operator>engine", "operator>launcher",
         "pure>subprocess", "pure>urllib", "pure>socket", "pure>http", "pure>io-module"],
)
def test_a_planted_import_breaks_its_contract(
    copy: Path, module: str, line: str, contract: str, message: str
) -> None:
    with (copy / module).open("a") as f:
        f.write(f"\n{line}  # noqa\n")
    proc = lint_imports(copy, copy)
    assert proc.returncode != 0
    assert f"{contract} BROKEN" in proc.stdout, proc.stdout
    assert message in proc.stdout, proc.stdout


def test_every_runtime_module_is_pure_or_does_io() -> None:
    """The two lists of mtp_runtime's modules in the contracts cover every module, once each,
    so a new runtime module must be put on one side (as the layers contract's exhaustive)."""
    modules = {
        f"mtp_runtime.{p.stem}"
        for p in (REPO / "runtime" / "mtp_runtime").glob("*.py") if p.stem != "__init__"
    }
    assert not [p for p in (REPO / "runtime" / "mtp_runtime").iterdir()
                if p.is_dir() and p.name != "__pycache__"], "a subpackage: name it below too"
    pure = set(CONTRACTS["runtime-pure"]["source_modules"])
    io = set(CONTRACTS["operator-imports-pure-runtime"]["forbidden_modules"])
    assert not pure & io, pure & io
    assert pure | io == modules, (modules - pure - io, (pure | io) - modules)
    assert io <= set(CONTRACTS["runtime-pure"]["forbidden_modules"]), "pure imports I/O"
