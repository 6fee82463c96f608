"""Fixtures for the runtime's unit tests (tests/conftest.py belongs to the project-wide setup)."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

FIXTURES = TESTS / "fixtures"
# Real vLLM 0.33.0 output, carried by the project (a copy of shared/'s reference data;
# tests/unit/test_reference_copies.py keeps the copy honest where shared/ is present).
SAMPLE_PROM = FIXTURES / "vllm-0.33.0" / "metrics-sample.prom"


@pytest.fixture
def sample_prom() -> str:
    return SAMPLE_PROM.read_text()


@pytest.fixture
def fake_vllm():
    from support.fake_vllm import FakeVLLM

    fake = FakeVLLM(k=4, model_name="dsv3-tiny", seed=7).start()
    yield fake
    fake.stop()
