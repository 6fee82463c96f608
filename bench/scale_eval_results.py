"""bench/results/evaluator.json and evaluator.md from a bench/scale_evaluator.py result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluator.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "evaluator.md").write_text(markdown(result))


def markdown(r: dict[str, Any]) -> str:
    return "# Evaluator at scale\n\n```\n" + json.dumps(
        {k: v for k, v in r.items() if k != "raw"}, indent=1, default=str)[:4000] + "\n```\n"
