"""`mtp-runtime stats`, the exporter and the evaluator's window on real vLLM 0.26.0 expositions.

The fixtures in tests/fixtures/h200-vllm/ were scraped from vLLM 0.26.0 serving the tiny MiMo
MTP model on an NVIDIA H200 under `mtp-runtime serve` (bench/gpu/measure.sh; figures in
bench/results/h200.md). For each of K=1 and K=4 one server was scraped after its warm-up
(scrape0) and after each run: predictable traffic at concurrency 1, 8, 64 (scrape1-3), then
unpredictable traffic at 1, 8, 64 (scrape4-6). So scrape3 holds only predictable drafts since
start, and scrape6 - scrape3 only unpredictable ones.

Expected figures come from the raw counter lines, read here with a regular expression (not
with the parser under test), and the definitions in runtime/README.md.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mtp_operator.api.v1alpha1 import RollbackSpec
from mtp_operator.rollback.evaluation import PoolEvaluator, pool_snapshot
from mtp_operator.rollback.signals import HIT_RATE_LOW, PoolRef
from mtp_runtime import exposition, spec_decode
from mtp_runtime.exporter import ExporterState, MTPExporter

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
FIX = REPO / "tests" / "fixtures" / "h200-vllm"
LABELS = ["warmup", "predictable-c1", "predictable-c8", "predictable-c64",
          "unpredictable-c1", "unpredictable-c8", "unpredictable-c64"]
KS = (1, 4)
LINE = re.compile(r'^(vllm:spec_decode_num_(?:drafts|draft_tokens|accepted_tokens|'
                  r'accepted_tokens_per_pos)_total)\{([^}]*)\} (\S+)$')


def scrape(k: int, i: int) -> Path:
    return FIX / f"k{k}-scrape{i}-{LABELS[i]}.prom"


def raw(path: Path) -> dict[str, object]:
    """The four counters, summed over series, straight from the text lines."""
    d = t = a = 0.0
    pos: dict[int, float] = {}
    for line in path.read_text().splitlines():
        hit = LINE.match(line)
        if not hit:
            continue
        name, labels, value = hit.group(1), hit.group(2), float(hit.group(3))
        if name.endswith("per_pos_total"):
            j = int(re.search(r'position="(\d+)"', labels).group(1))  # type: ignore[union-attr]
            pos[j] = pos.get(j, 0.0) + value
        elif name.endswith("num_drafts_total"):
            d += value
        elif name.endswith("num_draft_tokens_total"):
            t += value
        else:
            a += value
    return {"D": d, "T": t, "A": a, "c": [pos[j] for j in sorted(pos)]}


def minus(now: dict, then: dict) -> dict:
    return {"D": now["D"] - then["D"], "T": now["T"] - then["T"], "A": now["A"] - then["A"],
            "c": [x - y for x, y in zip(now["c"], then["c"], strict=True)]}


def expected(r: dict) -> dict[str, float]:
    d, t, a, c = r["D"], r["T"], r["A"], r["c"]
    k = t / d
    return {"hit_rate": c[0] / d, "acceptance_rate": a / t, "mean_acceptance_length": 1 + a / d,
            "avg_k_used": a / d, "num_speculative_tokens": k,
            "error_propagation_rate": (d * (k - 1) - a + c[-1]) / t}


@pytest.mark.parametrize("k", KS)
def test_fixtures_are_real_runs_of_that_k(k: int) -> None:
    seq = [raw(scrape(k, i)) for i in range(len(LABELS))]
    for r in seq:
        assert r["T"] == k * r["D"]  # vLLM drafted exactly K tokens per draft
        assert len(r["c"]) == k
        assert all(x >= y for x, y in zip(r["c"], r["c"][1:], strict=False))  # a prefix is accepted
        assert sum(r["c"]) == r["A"]
    for older, newer in itertools.pairwise(seq):
        assert newer["D"] > older["D"]  # every run drafted (one server, no restart)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("i", [3, 6])
def test_stats_cli_on_real_exposition(k: int, i: int) -> None:
    path = scrape(k, i)
    out = subprocess.run([sys.executable, "-m", "mtp_runtime.cli", "stats", str(path)],
                         capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO / "runtime")})
    got = json.loads(out.stdout)
    want = expected(raw(path))
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key
    assert got["num_speculative_tokens"] == k


@pytest.mark.parametrize("k", KS)
def test_predictable_traffic_is_accepted_more_than_unpredictable(k: int) -> None:
    pred = raw(scrape(k, 3))
    unpred = minus(raw(scrape(k, 6)), raw(scrape(k, 3)))
    assert expected(pred)["hit_rate"] > expected(unpred)["hit_rate"]


def _exporter(k: int, span: float) -> tuple[MTPExporter, list[float]]:
    texts = [scrape(k, i).read_text() for i in range(len(LABELS))]
    clock = [0.0]
    feed = iter(texts)
    exp = MTPExporter("http://vllm.invalid/metrics", window_s=span,
                      state=ExporterState(configured_k=k), clock=lambda: clock[0],
                      fetch=lambda _url: next(feed))
    return exp, clock


def _values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for s in exposition.parse_exposition(text).samples}


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize(("span", "since"), [(300.0, 0), (45.0, 3)])
def test_exporter_window_on_real_scrapes(k: int, span: float, since: int) -> None:
    """Scrapes 15 s apart; a 300 s window holds all of them, a 45 s one the last three runs
    (the unpredictable ones) over the baseline scrape3."""
    exp, clock = _exporter(k, span)
    for i in range(len(LABELS)):
        clock[0] = 15.0 * i
        assert exp.scrape_once()
    v = _values(exp.render())
    inc = minus(raw(scrape(k, 6)), raw(scrape(k, since)))
    want = expected(inc)
    assert v[("mtp_window_drafts", ())] == inc["D"]
    assert v[("mtp_hit_rate", ())] == pytest.approx(want["hit_rate"])
    assert v[("mtp_acceptance_rate", ())] == pytest.approx(want["acceptance_rate"])
    assert v[("mtp_mean_acceptance_length", ())] == pytest.approx(
        want["mean_acceptance_length"])
    assert v[("mtp_error_propagation_rate", ())] == pytest.approx(
        want["error_propagation_rate"])
    assert v[("mtp_observed_num_speculative_tokens", ())] == k
    for j, c in enumerate(inc["c"]):
        assert v[("mtp_position_acceptance_rate", (("position", str(j)),))] == pytest.approx(
            c / inc["D"])


@pytest.mark.parametrize("k", KS)
def test_real_exporter_output_matches_the_counters(k: int) -> None:
    """The runtime's exporter ran beside vLLM (1 s scrapes, 3600 s window) and was read after
    the last run: its window holds every draft since its first scrape of vLLM, which came at
    the latest during the warm-up (scrape0)."""
    v = _values((FIX / f"k{k}-exporter.prom").read_text())
    end, warm = raw(scrape(k, 6)), raw(scrape(k, 0))
    drafts = v[("mtp_window_drafts", ())]
    assert end["D"] - warm["D"] <= drafts <= end["D"]
    assert v[("mtp_num_speculative_tokens", ())] == k
    assert v[("mtp_observed_num_speculative_tokens", ())] == k
    assert v[("mtp_runtime_vllm_up", ())] == 1.0


@pytest.mark.parametrize("k", KS)
def test_evaluator_window_on_real_scrapes(k: int) -> None:
    """The built-in evaluator over the same scrapes (30 s apart, 90 s window, no `for`):
    its figures at each scrape are those of the increase over the window, and HitRateLow
    fires exactly when that hit rate is under the threshold."""
    spec = RollbackSpec(window_seconds=90, for_seconds=0, min_drafts=1)
    ev = PoolEvaluator(PoolRef("ns", "tiny", "NVIDIA-H200"), repeat_seconds=0.0)
    t0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    seq = [raw(scrape(k, i)) for i in range(len(LABELS))]
    for i in range(len(LABELS)):
        snap = spec_decode.spec_snapshot(scrape(k, i).read_text())
        result = ev.observe(t0 + timedelta(seconds=30 * i), pool_snapshot({"pod-0": snap}),
                            spec, k=k)
        if i == 0:
            assert result.no_data
            continue
        inc = minus(seq[i], seq[max(0, i - 3)])  # baseline: the scrape 90 s before
        want = expected(inc)
        assert result.figures["drafts"] == inc["D"]
        assert result.figures["hit_rate"] == pytest.approx(want["hit_rate"])
        firing = [s for s in result.signals if s.alert == HIT_RATE_LOW and s.status == "firing"]
        low = want["hit_rate"] < spec.min_hit_rate
        if low:
            assert firing and firing[0].value == pytest.approx(want["hit_rate"])
        else:
            assert not firing
