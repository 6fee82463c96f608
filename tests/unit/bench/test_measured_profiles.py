"""The measured GPU profile rows come from the committed real-size results, and reach the pools
of hybrid models only."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.planning import plan_pool
from mtp_operator.tuning.priors import PRIORS, prior_for
from mtp_runtime.gpu_profiles import (
    MEASURED_HYBRID_PROFILES,
    KRequest,
    default_k,
    is_hybrid,
    resolve_k,
)

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "bench" / "results" / "gpu" / "realsize.json"
H100 = "NVIDIA-H100-80GB-HBM3"


def _summary_module():
    spec = importlib.util.spec_from_file_location(
        "realsize_summary", REPO / "bench" / "gpu" / "realsize_summary.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["realsize_summary"] = mod
    spec.loader.exec_module(mod)
    return mod


def _hybrid_sweeps() -> dict[str, dict]:
    data = json.loads(RESULTS.read_text())
    return {gpu: kinds["qwen35-27b"] for gpu, kinds in data["sweeps"].items()
            if "qwen35-27b" in kinds}


def test_each_measured_row_is_what_the_results_derive() -> None:
    """Recompute the rule from the raw runs in realsize.json (not the stored derivation)."""
    mod = _summary_module()
    raw = REPO / "bench" / "results" / "gpu" / "raw"
    merged = mod.merge(mod.load_calls(raw))
    derived = {}
    for gpu, kinds in merged.items():
        if "qwen35-27b" in kinds:
            choice = mod.choose(kinds["qwen35-27b"], mod.REFERENCE)
            derived[mod.family(gpu)] = choice
    assert derived, "no hybrid sweep in bench/results/gpu/raw"
    for row in MEASURED_HYBRID_PROFILES:
        assert row.family in derived, f"{row.family}: no measurement behind the row"
        d = derived[row.family]
        assert row.k == d["k"], (row, d["k"])
        assert tuple(tuple(e) for e in d["schedule"]) == row.schedule
        assert f"{round(100 * d['worst_share'])} %" in row.reason
    # and the stored summary says the same
    stored = {mod.family(g): s["derived"]["defaults"]["p0.8"]["k"]
              for g, s in _hybrid_sweeps().items()}
    assert {r.family: r.k for r in MEASURED_HYBRID_PROFILES} == stored


def test_the_rule_on_first_principles() -> None:
    """A made-up sweep: K=3 wins every band while nobody waits; at 64 its requests wait, and
    K=1 (which holds them all) is worth more there: the default is the K that loses least."""
    mod = _summary_module()

    def run(k, c, tps, waiting=0.0):
        return {"k": k, "p_set": 0.8, "concurrency": c, "output_tokens_per_s": tps,
                "mean_acceptance_length": mod.tau_curve(k, 0.8) if k else None,
                "max_waiting": waiting}

    runs = {}
    for k, row in {0: (10, 40, 160, 600), 1: (15, 55, 210, 800), 3: (20, 70, 250, 500)}.items():
        for c, tps in zip((1, 4, 16, 64), row, strict=True):
            runs[(k, 0.8, c)] = run(k, c, tps, waiting=20.0 if (k == 3 and c == 64) else 0.0)
    slot = {"servers": {0: {}, 1: {}, 3: {}}, "runs": runs, "max_tokens": 64,
            "env": {"nvidia-smi": "NVIDIA H100 80GB HBM3"}}
    got = mod.choose(slot, 0.8)
    # M=3: shares 1, 1, 1, 500/800; M=1: 15/20, 55/70, 210/250, 1 -> worst 0.75 > 0.625
    assert got["k"] == 1 and got["worst_share"] == pytest.approx(0.75)
    assert got["schedule"] == []


def test_hybrid_models_get_the_measured_row_dense_ones_the_table() -> None:
    row = next(r for r in MEASURED_HYBRID_PROFILES if r.family == "H100")
    assert is_hybrid("Qwen/Qwen3.6-27B", "mtp") and is_hybrid("org/x", "qwen3_next_mtp")
    assert is_hybrid("Qwen/Qwen3-Next-80B-A3B-Instruct", "mtp")
    assert not is_hybrid("deepseek-ai/DeepSeek-V3", "deepseek_mtp")
    assert not is_hybrid("XiaomiMiMo/MiMo-7B-RL", "mtp")
    hybrid = resolve_k(H100, KRequest(model="Qwen/Qwen3.6-27B", method="qwen3_next_mtp"))
    assert (hybrid.k, hybrid.source) == (row.k, "profile") and "measured" in hybrid.reason
    dense = resolve_k(H100, KRequest(model="deepseek-ai/DeepSeek-V3", method="deepseek_mtp"))
    assert dense.k == default_k(H100) and "measured" not in dense.reason
    # a cluster override or the resource's own table still wins
    assert resolve_k(H100, KRequest(model="Qwen/Qwen3.6-27B"), {"H100": 4}).k == 4
    assert resolve_k(H100, KRequest(model="Qwen/Qwen3.6-27B", profiles={"H100": 5})).k == 5


def test_a_hybrid_pool_plans_the_measured_k() -> None:
    spec = MTPInferenceSpec.model_validate(
        {"model": "Qwen/Qwen3.6-27B", "speculative": {"method": "qwen3_next_mtp"}})
    row = next(r for r in MEASURED_HYBRID_PROFILES if r.family == "H100")
    assert plan_pool(spec, H100).k == row.k


def test_priors_are_the_measured_fits() -> None:
    """Each prior line is the committed fit at that concurrency (ms per request-step)."""
    sweeps = {g: s for g, s in _hybrid_sweeps().items()}
    assert PRIORS, "no prior"
    for prior in PRIORS:
        gpu = next(g for g in sweeps if prior.family in g)
        fits = sweeps[gpu]["derived"]["cost_fit"]
        for c, base, per in prior.lines:
            f = fits[str(int(c))]
            assert base == pytest.approx(f["base_ms"], abs=1e-3)
            assert per == pytest.approx(f["per_token_ms"], abs=1e-3)
    assert prior_for(H100, hybrid=True) is not None
    assert prior_for(H100, hybrid=False) is None
