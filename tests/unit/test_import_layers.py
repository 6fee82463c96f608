"""The import-layer contract of pyproject.toml ([tool.importlinter]), checked by import-linter.

Arrows point down only: cli > app > control > adapters > pure logic (package root and
rollback/) > api; pure logic does no I/O; no cycles; mtp_runtime stands alone. The last two
tests run the same contract over a copy of the packages with one bad import each, so a
contract that stopped seeing imports would fail here too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


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
    assert "4 kept, 0 broken" in proc.stdout, proc.stdout


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
