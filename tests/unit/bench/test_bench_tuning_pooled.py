"""bench/tuning/tuning_pooled.py: the sweeps of several bench/tuning/tuning.py runs pooled per
class and K."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.scripts import load

REPO = Path(__file__).resolve().parents[3]
tuning_pooled = load("bench/tuning/tuning_pooled.py")

SETTINGS = {"concurrency": 4, "max_tokens": 64, "window_s": 20.0, "replicas": 2,
            "worker_core_per_replica": True}


def window(k_tps: float, ref_tps: float) -> dict:
    return {"k": {"output_tokens_per_cpu_s": k_tps}, "ref": {"output_tokens_per_cpu_s": ref_tps}}


def run(sweep: dict[str, list[tuple[float, float]]], final_k: int, share: float, **settings):
    return {"settings": {**SETTINGS, **settings}, "profile_k": 3, "classes": {"flat": {
        "sweep": {k: {"windows": [window(a, b) for a, b in ws]} for k, ws in sweep.items()},
        "best_k": 1, "tuner": {"final_k": final_k, "share": share, "trials": [1, 0],
                               "stayed": True}}}}


def test_rounds_of_all_runs_are_pooled_into_one_median_per_k():
    a = run({"1": [(110, 100), (90, 100)], "2": [(120, 100)], "3": [(5, 5)]}, 2, 0.9)
    b = run({"1": [(130, 100)], "2": [(100, 100), (101, 100)], "3": [(7, 7)]}, 1, 1.0)
    res = tuning_pooled.pool([("a", a), ("b", b)])
    sweep = res["classes"]["flat"]["sweep"]
    # K=1: ratios 1.1, 0.9, 1.3 -> median 1.1; K=2: 1.2, 1.0, 1.01 -> median 1.01
    assert sweep[1]["median"] == pytest.approx(1.1) and sweep[1]["rounds"] == 3
    assert sweep[2]["median"] == pytest.approx(1.01) and sweep[2]["rounds"] == 3
    assert sweep[3]["median"] == pytest.approx(1.0)
    assert res["classes"]["flat"]["best_k"] == 1
    tuners = {t["run"]: t for t in res["classes"]["flat"]["tuners"]}
    # run a ended at K=2: 1.01 / 1.1 of the pooled best; run b at the pooled best itself
    assert tuners["a"]["pooled_share"] == pytest.approx(1.01 / 1.1, abs=1e-4)
    assert tuners["b"]["pooled_share"] == pytest.approx(1.0)
    assert tuners["a"]["own_share"] == 0.9  # its own sweep's figure is kept beside it
    assert "| 1 (best) | 1.100 |" in tuning_pooled.markdown(res)


def test_runs_with_other_engine_settings_are_refused():
    a = run({"1": [(1, 1)]}, 1, 1.0)
    b = run({"1": [(1, 1)]}, 1, 1.0, worker_core_per_replica=None)
    with pytest.raises(SystemExit, match="worker_core_per_replica"):
        tuning_pooled.pool([("a", a), ("b", b)])
