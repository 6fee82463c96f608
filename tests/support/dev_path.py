"""Puts the developer helpers' folders on the venv's path, as an editable install does: one
.pth file in site-packages (`make install` runs this with the venv's python). The folders are
pyproject.toml's [tool.pytest.ini_options] pythonpath, so pytest and the bench scripts
(`.venv/bin/python bench/...`) import `support`, `sandbox_lib`, `traffic`, `profiling`, ...
the same way. Standard library only."""

from __future__ import annotations

import sysconfig
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PTH = "mtp-operator-dev.pth"


def folders() -> list[Path]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [REPO / p for p in config["tool"]["pytest"]["ini_options"]["pythonpath"]]


def main() -> None:
    target = Path(sysconfig.get_paths()["purelib"]) / PTH
    text = "".join(f"{folder}\n" for folder in folders())
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


if __name__ == "__main__":
    main()
