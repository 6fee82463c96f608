"""bench/classes/classes.py pools a phase's windows over its rounds (ABAB runs)."""

from __future__ import annotations

import statistics

from support.scripts import load

classes = load("bench/classes/classes.py", "bench_classes")


def _phase(per_cpu: list[float], wall: list[float], errors: int, completed: int) -> dict:
    windows = [{"output_per_cpu_s": c, "wall_output_tps": w, "engines": []}
               for c, w in zip(per_cpu, wall, strict=True)]
    return {"engine_ks": [4, 4], "routed": False, "windows": windows,
            "median_output_per_cpu_s": statistics.median(per_cpu),
            "median_wall_output_tps": statistics.median(wall),
            "errors": errors, "completed": completed}


def test_rounds_pool_windows_and_keep_each_rounds_median() -> None:
    first = classes.merge_round(None, _phase([10, 30, 20], [100, 300, 200], 1, 50), 1)
    both = classes.merge_round(first, _phase([40, 50, 60], [400, 500, 600], 0, 70), 2)
    # the median of all six windows, not the median of the two rounds' medians (20 and 50)
    assert both["median_output_per_cpu_s"] == 35.0
    assert both["median_wall_output_tps"] == 350.0
    assert (both["errors"], both["completed"]) == (1, 120)
    assert [w["round"] for w in both["windows"]] == [1, 1, 1, 2, 2, 2]
    rounds = [(r["round"], r["median_output_per_cpu_s"]) for r in both["rounds"]]
    assert rounds == [(1, 20), (2, 50)]
