"""Moved to bench/k-change/k_change.py (2026-12-06). This forwarder keeps a command line that
names the old path working for a run already queued; it is removed once that run has started."""

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "k-change" / "k_change.py"
sys.path[0] = str(HERE.parent)
runpy.run_path(str(HERE), run_name="__main__")
