"""bench/gpu/summarize.py --merge: the K=0..6 table is filled over several device calls."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[3] / "bench" / "gpu" / "summarize.py"
spec = importlib.util.spec_from_file_location("gpu_summarize", PATH)
summarize = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summarize)

ENV = {"nvidia-smi": "NVIDIA H200, 570", "nvidia-smi-header": "Driver 570", "vllm": "0.26.0",
       "torch": "2.11.0+cu130"}


def run(k: int, conc: int = 1) -> dict:
    return {"k": k, "concurrency": conc, "traffic": "predictable"}


def test_keeps_other_k_replaces_the_new_ones_and_drops_what_is_now_measured() -> None:
    prev = {"machine": dict(ENV), "runs": [run(0), run(1), run(4, 8)],
            "servers": [{"k": 0}, {"k": 1}, {"k": 4}],
            "skipped": [{"k": 2, "why": "time box"}, {"k": 3, "why": "time box"}],
            "device_calls_s": {"sweep-1": 130.0}}
    new = {"runs": [run(2), {**run(4, 8), "new": True}], "servers": [{"k": 2}, {"k": 4}],
           "skipped": [], "planned_k_h200": 6}
    out, calls = summarize.merged(prev, new, dict(ENV), {"sweep-5": "560"})
    assert sorted((r["k"], r["concurrency"]) for r in out["runs"]) == [(0, 1), (1, 1), (2, 1),
                                                                      (4, 8)]
    assert next(r for r in out["runs"] if r["k"] == 4).get("new") is True
    assert sorted(s["k"] for s in out["servers"]) == [0, 1, 2, 4]
    assert out["skipped"] == [{"k": 3, "why": "time box"}]
    assert calls == {"sweep-1": "130.0", "sweep-5": "560"}


def test_refuses_another_machine() -> None:
    prev = {"machine": dict(ENV), "runs": [], "servers": [], "skipped": []}
    with pytest.raises(SystemExit, match="vllm differs"):
        summarize.merged(prev, {"runs": [], "servers": [], "skipped": []},
                         {**ENV, "vllm": "0.27.0"}, {})
