"""The reaction benchmark's table: bench/results/reaction.md from reaction.json's data."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "sandbox")]

from reaction_common import BROKEN, HEALTHY  # noqa: E402

# ---- output ---------------------------------------------------------------------------------


def _row(name: str, s: dict[str, Any], what: str) -> str:
    if not s.get("n"):
        return f"| {name} | {what} | 0 | - | - | - | - |"
    ms = lambda x: f"{x * 1000:.0f} ms"  # noqa: E731
    return (f"| {name} | {what} | {s['n']} | {ms(s['min'])} | {ms(s['median'])} | "
            f"{ms(s['p99'])} | {ms(s['max'])} |")


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Rollback reaction time (sandbox)",
        "",
        f"Measured {result['finished']} by `bench/reaction.py` on {m['nproc']} CPUs "
        f"({m['cpu'] or 'unknown CPU'}), {m['memory_gib']} GiB, Python {m['python']}, "
        f"kube-apiserver {m['kube_apiserver']} (local sandbox; {m['nodes']}); 1-minute load "
        f"average {m['loadavg_start']:.1f} at the start, {m['loadavg_end']:.1f} at the end "
        "(the sandbox, the operator, the fakes and this script share these CPUs).",
        "",
        "| path | measured | n | min | median | p99 | max |",
        "|---|---|---|---|---|---|---|",
    ]
    wh = result.get("webhook")
    if wh:
        lines.append(_row("webhook, one alert at a time", wh["sequential"]["summary"]["patch_s"],
                          "POST sent → Deployment patched (watch)"))
        lines.append(_row("webhook, one alert at a time", wh["sequential"]["summary"]["http_s"],
                          "POST sent → 200 answered"))
        burst = wh["burst"]["summary"]["patch_s"]
        lines.append(_row(f"webhook, {burst['n']} alerts at once (one per pool)", burst,
                          "POST sent → Deployment patched (watch)"))
    ev = result.get("evaluator")
    if ev:
        lines.append(_row("built-in evaluator", ev["summary"]["degrade_to_patch_s"],
                          f"acceptance {HEALTHY}→{BROKEN} → Deployment patched"))
        lines.append(_row("built-in evaluator", ev["summary"]["crossing_to_patch_s"],
                          "windowed hit rate < 0.88 in the fake's counters → patched"))
    lines.append("")
    if wh:
        lines.append(
            f"Webhook: {wh['resources']} resources x {wh['pools'] // wh['resources']} pools, "
            "cooldownSeconds 0 (each alert acts), single MTPHitRateLow alerts (webhook v4, "
            "bearer token) spread round-robin over the pools; the Deployment watch is a "
            "lightkube AsyncClient in the bench process. The receiver answers 200 after the "
            "status write and the patch, so the answer comes after the patch is visible. The "
            "burst sends one alert to every pool still speculating (K > 0) at the same time "
            "(one request each); the receiver handles requests concurrently but decides and "
            "patches one pool at a time per MTPInference, and the operator, the API server "
            "and this script share the CPUs, so later ones wait.")
    if ev:
        r = ev["rollback"]
        lines.append(
            f"Evaluator: `--evaluator-interval {ev['interval_s']:g}`, windowSeconds "
            f"{r['windowSeconds']}, forSeconds {r['forSeconds']}, minDrafts {r['minDrafts']}; "
            f"FakeVLLM per pod at {ev['drafts_per_second']:g} drafts/s. The evaluator acts on "
            "the first scrape after the crossing, so its reaction is bounded by the interval "
            "plus a scrape and a reconcile.")
    lines.append("")
    return "\n".join(lines)
