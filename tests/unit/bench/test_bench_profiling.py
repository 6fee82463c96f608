"""bench/common/profiling.py: the summary of a py-spy profile and the per-process CPU figures."""

from __future__ import annotations

import os
import time
from pathlib import Path

import profiling  # bench/common/profiling.py

REPO = Path(__file__).resolve().parents[3]

SITE = "/venv/lib/python3.11/site-packages"
STACKS = "\n".join([
    # 6 samples in json under our reconciler, 3 in our code itself, 1 in kopf
    f"run (/usr/lib/python3.11/asyncio/base_events.py:600);_pass ({SITE}/mtp_operator/"
    f"control/reconciler.py:290);dumps (/usr/lib/python3.11/json/__init__.py:231) 6",
    f"run (/usr/lib/python3.11/asyncio/base_events.py:600);_pass ({SITE}/mtp_operator/"
    f"control/reconciler.py:301) 3",
    f"run (/usr/lib/python3.11/asyncio/base_events.py:600);handle ({SITE}/kopf/_core/x.py:9) 1",
    "not a stack line",
])


def test_self_inclusive_and_areas_are_counted_from_the_stacks():
    s = profiling.summarise(STACKS, rate=100)
    assert s["samples"] == 10
    assert s["cpu_s"] == 0.1  # 10 samples at 100 Hz
    areas = {a["area"]: a["samples"] for a in s["by_area"]}
    assert areas == {"json": 6, "mtp_operator": 3, "kopf": 1}
    self_ = {r["function"]: r["samples"] for r in s["self"]}
    assert self_ == {"dumps": 6, "_pass": 3, "handle": 1}
    incl = {r["function"]: r["samples"] for r in s["inclusive"]}
    # our functions only, each counted once per stack whichever of its lines are on it
    assert incl == {"_pass": 9}
    assert next(r for r in s["self"] if r["function"] == "_pass")["file"] == (
        "mtp_operator/control/reconciler.py")


def test_an_empty_profile_has_no_rows():
    s = profiling.summarise("", rate=200)
    assert s["samples"] == 0 and s["self"] == [] and s["by_area"] == []


def test_frames_without_a_line_number_keep_their_file():
    assert profiling.frame_key("f (a/b.py)") == ("f", "a/b.py")
    assert profiling.frame_key("<module> (x.py:3)") == ("<module>", "x.py")
    assert profiling.frame_key("odd") == ("odd", "")


def test_cpu_delta_sees_this_process_burn_cpu():
    before = profiling.process_cpu()
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    rows = profiling.cpu_delta(before, profiling.process_cpu())
    mine = next(r for r in rows if r["pid"] == os.getpid())
    # /proc counts in clock ticks (1/100 s here): within two ticks of what we burned
    assert mine["cpu_s"] >= 0.3 - 2 / profiling.CLOCK_TICKS
    assert rows == sorted(rows, key=lambda r: -r["cpu_s"])


def test_a_reused_pid_counts_from_zero():
    before = {7: ("old", 50.0)}
    after = {7: ("new", 1.5)}
    assert profiling.cpu_delta(before, after) == [{"pid": 7, "command": "new", "cpu_s": 1.5}]
