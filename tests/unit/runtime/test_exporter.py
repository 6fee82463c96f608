"""The exporter over real loopback HTTP, scraping the fake vLLM."""

from __future__ import annotations

import time
import urllib.request

import pytest

from mtp_runtime import exposition
from mtp_runtime.exporter import FAMILIES, ExporterState, MTPExporter
from mtp_runtime.gpu_detect import GPUInfo

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


def _values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for s in exposition.parse_exposition(text).samples}


@pytest.fixture
def exporter(fake_vllm):
    clock = Clock()
    state = ExporterState(
        configured_k=4,
        gpu=GPUInfo("NVIDIA-H200", "NVIDIA H200", 8, 143771, "nvml"),
        expected_product="NVIDIA-H100-80GB-HBM3",
        gpu_mismatch=True,
        k_source="profile",
        k_mode="auto",
    )
    exp = MTPExporter(fake_vllm.metrics_url, window_s=300, state=state, clock=clock)
    exp.start(host="127.0.0.1", port=0, scrape=False)
    exp.clock_ = clock  # type: ignore[attr-defined]
    yield exp
    exp.stop()


def test_figures_over_the_window(fake_vllm, exporter) -> None:
    clock = exporter.clock_
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    assert exporter.scrape_once()
    v = _values(_get(url))
    assert v[("mtp_runtime_vllm_up", ())] == 1.0
    assert ("mtp_hit_rate", ()) not in v  # one scrape: no increase yet → absent, not 0
    assert v[("mtp_window_drafts", ())] == 0.0

    fake_vllm.advance([4, 2, 0])
    clock.t += 15
    assert exporter.scrape_once()
    body = _get(url)
    v = _values(body)
    assert v[("mtp_hit_rate", ())] == pytest.approx(2 / 3)
    assert v[("mtp_acceptance_rate", ())] == pytest.approx(0.5)
    assert v[("mtp_mean_acceptance_length", ())] == pytest.approx(3.0)
    assert v[("mtp_avg_k_used", ())] == pytest.approx(2.0)
    assert v[("mtp_error_propagation_rate", ())] == pytest.approx(1 / 3)
    assert v[("mtp_observed_num_speculative_tokens", ())] == 4.0
    assert v[("mtp_num_speculative_tokens", ())] == 4.0
    assert v[("mtp_position_acceptance_rate", (("position", "3"),))] == pytest.approx(1 / 3)
    assert v[("mtp_window_drafts", ())] == 3.0
    assert v[("mtp_runtime_gpu_mismatch", (("detected", "NVIDIA-H200"),
                                           ("expected", "NVIDIA-H100-80GB-HBM3")))] == 1.0
    info = next(s for s in exposition.parse_exposition(body).samples if s.name == "mtp_gpu_info")
    assert info.labels["gpu_product"] == "NVIDIA-H200"
    assert info.labels["gpu_family"] == "H200"
    assert info.labels["gpu_count"] == "8"
    types = exposition.parse_exposition(body).types
    assert set(types) == set(FAMILIES)

    # idle for longer than the window: the figures go absent again (no data, never 0)
    clock.t += 400
    assert exporter.scrape_once()
    v = _values(_get(url))
    assert ("mtp_hit_rate", ()) not in v
    assert ("mtp_error_propagation_rate", ()) not in v


def test_vllm_restart_inside_the_window(fake_vllm, exporter) -> None:
    clock = exporter.clock_
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    fake_vllm.advance([4] * 100)
    exporter.scrape_once()
    fake_vllm.advance([0] * 10)
    clock.t += 15
    exporter.scrape_once()
    fake_vllm.restart()
    fake_vllm.advance([4] * 10)
    clock.t += 15
    exporter.scrape_once()
    v = _values(_get(url))
    # 10 rejected drafts, then a reset, then 10 full drafts: no negative increase
    assert v[("mtp_window_drafts", ())] == 20.0
    assert v[("mtp_hit_rate", ())] == pytest.approx(0.5)


def test_vllm_down_keeps_serving(fake_vllm, exporter) -> None:
    clock = exporter.clock_
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    fake_vllm.advance([1])
    assert exporter.scrape_once()
    fake_vllm.advance([1, 1])
    clock.t += 15
    assert exporter.scrape_once()
    fake_vllm.stop()
    clock.t += 15
    assert not exporter.scrape_once()
    v = _values(_get(url))
    assert v[("mtp_runtime_vllm_up", ())] == 0.0
    assert v[("mtp_runtime_scrape_errors_total", ())] == 1.0
    assert v[("mtp_hit_rate", ())] == 1.0  # what was seen in the window is still true


def test_http_errors_count_as_down(fake_vllm, exporter) -> None:
    fake_vllm.metrics_status = 500
    assert not exporter.scrape_once()
    assert exporter.vllm_up is False


def test_background_scraping(fake_vllm) -> None:
    exp = MTPExporter(fake_vllm.metrics_url, window_s=60, interval_s=0.05)
    exp.start(host="127.0.0.1", port=0)
    try:
        deadline = time.monotonic() + 10
        while fake_vllm.scrapes < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        fake_vllm.advance([4, 4, 0])
        while time.monotonic() < deadline:
            v = _values(_get(f"http://127.0.0.1:{exp.port}/metrics"))
            if ("mtp_hit_rate", ()) in v:
                break
            time.sleep(0.05)
        assert v[("mtp_hit_rate", ())] == pytest.approx(2 / 3)
        assert v[("mtp_runtime_vllm_up", ())] == 1.0
        assert _get(f"http://127.0.0.1:{exp.port}/healthz") == "ok\n"
    finally:
        exp.stop()
