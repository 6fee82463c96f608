"""Real vLLM 0.26.0 expositions of the real-size sweep (27B-class hybrid and 7B-class dense on
an H100, dummy weights, acceptance set in place): the figures in
bench/results/gpu/realsize.json and our own parsers agree with the raw counters, read here with
nothing but a regular expression."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mtp_operator.tuning.counters import pod_k, pod_sample
from mtp_runtime import figures

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures"
# (model kind in realsize.json, fixture folder, run tag)
RUNS = tuple(("qwen35-27b", "realsize-h100", t)
             for t in ("k3-p0.8-c16", "k3-p0.8-c64", "k6-p0.9-c1", "k0-p0.8-c16")) + tuple(
    ("mimo-7b", "realsize-h100-mimo7b", t)
    for t in ("k3-p0.8-c1", "k6-p0.8-c16", "k0-p0.8-c128", "k5-p0.8-c4"))
IDS = [f"{kind}-{tag}" for kind, _, tag in RUNS]
LINE = re.compile(r'^(vllm:[a-z_]+)\{([^}]*)\} ([0-9.e+-]+)$', re.M)


def raw(text: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for name, labels, value in LINE.findall(text):
        pos = re.search(r'position="(\d+)"', labels)
        out[(name, pos.group(1) if pos else "")] = out.get((name, pos.group(1) if pos else ""),
                                                            0.0) + float(value)
    return out


def delta(folder: str, tag: str) -> dict[tuple[str, str], float]:
    before = raw((FIXTURES / folder / f"{tag}-before.prom").read_text())
    after = raw((FIXTURES / folder / f"{tag}-after.prom").read_text())
    return {key: after[key] - before.get(key, 0.0) for key in after}


def stored(tag: str, kind: str = "qwen35-27b") -> dict:
    data = json.loads((REPO / "bench" / "results" / "gpu" / "realsize.json").read_text())
    for kinds in data["sweeps"].values():
        runs = kinds.get(kind, {}).get("runs", {})
        if tag in runs:
            return runs[tag]
    raise AssertionError(f"{tag} not in realsize.json")


@pytest.mark.parametrize(("kind", "folder", "tag"), RUNS, ids=IDS)
def test_stored_figures_are_the_counters(kind: str, folder: str, tag: str) -> None:
    d = delta(folder, tag)
    row = stored(tag, kind)
    k = int(tag.split("-")[0][1:])
    drafts = d.get(("vllm:spec_decode_num_drafts_total", ""), 0.0)
    accepted = d.get(("vllm:spec_decode_num_accepted_tokens_total", ""), 0.0)
    gen = d[("vllm:generation_tokens_total", "")]
    steps = d[("vllm:iteration_tokens_total_count", "")]
    assert row["generation_tokens"] == gen and row["engine_steps"] == steps
    assert row["tokens_per_engine_step"] == pytest.approx(gen / steps, abs=1e-3)
    if k == 0:
        assert drafts == 0 and row["hit_rate"] is None
        return
    per_pos = [d[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(j))]
               for j in range(k)]
    draft_tokens = d[("vllm:spec_decode_num_draft_tokens_total", "")]
    assert draft_tokens == k * drafts  # one K throughout the run
    assert row["hit_rate"] == pytest.approx(per_pos[0] / drafts, abs=1e-5)  # json: 5 places
    assert row["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts, abs=1e-5)
    assert row["position_acceptance_rate"] == pytest.approx([c / drafts for c in per_pos],
                                                          abs=1e-5)
    assert sum(per_pos) == accepted
    # the tokens the run emitted are its request-steps plus the accepted draft tokens
    assert row["completion_tokens"] <= gen


@pytest.mark.parametrize(("kind", "folder", "tag"), RUNS, ids=IDS)
def test_our_parsers_read_the_same(kind: str, folder: str, tag: str) -> None:
    before = (FIXTURES / folder / f"{tag}-before.prom").read_text()
    after = (FIXTURES / folder / f"{tag}-after.prom").read_text()
    d = delta(folder, tag)
    k = int(tag.split("-")[0][1:])
    fig = figures.figures(after, before)
    s0, s1 = pod_sample(0.0, before), pod_sample(1.0, after)
    assert pod_k(s1) == k
    assert s1.generation_tokens - s0.generation_tokens == d[("vllm:generation_tokens_total", "")]
    assert s1.engine_steps - s0.engine_steps == d[("vllm:iteration_tokens_total_count", "")]
    if k:
        drafts = d[("vllm:spec_decode_num_drafts_total", "")]
        assert fig["drafts"] == drafts
        assert fig["num_speculative_tokens"] == k
        assert fig["hit_rate"] == pytest.approx(
            d[("vllm:spec_decode_num_accepted_tokens_per_pos_total", "0")] / drafts)
    # the gauges the capacity view reads are present in a real exposition
    assert s1.running is not None and s1.waiting is not None and s1.kv_usage is not None
    assert s1.waiting_for_capacity is not None


def test_the_capacity_bound_run_waited() -> None:
    """K=3 at 64 requests: vLLM's KV cache held ~45 requests of 1,024 tokens, so some of the
    64 waited (the gauges polled during the run), while K=0 ran all 16 at c=16 at once."""
    assert stored("k3-p0.8-c64")["max_waiting"] > 0
    assert stored("k3-p0.8-c64")["max_running"] < 64
    assert stored("k0-p0.8-c16")["max_waiting"] == 0


def test_the_dense_model_has_the_same_capacity_at_every_k() -> None:
    """A dense model keeps no per-request state that grows with K: its KV cache (tokens, from
    vLLM's own log line at start) differs by the drafter's weights only (< 5 %), unlike the
    hybrid's 135,338 tokens at K=0 against 27,349 at K=6."""
    data = json.loads((REPO / "bench" / "results" / "gpu" / "realsize.json").read_text())
    sweep = next(k["mimo-7b"] for k in data["sweeps"].values() if "mimo-7b" in k)
    tokens = {int(k): s["kv_cache_tokens"] for k, s in sweep["servers"].items()}
    assert set(tokens) == set(range(7))
    assert min(tokens.values()) > 0.95 * max(tokens.values())
