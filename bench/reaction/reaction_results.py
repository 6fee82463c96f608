"""The reaction benchmark's table: bench/results/reaction.md from reaction.json's data."""

from __future__ import annotations

from typing import Any

from reaction_common import BROKEN, HEALTHY

# ---- output ---------------------------------------------------------------------------------


def _row(name: str, s: dict[str, Any], what: str) -> str:
    if not s.get("n"):
        return f"| {name} | {what} | 0 | - | - | - | - |"
    ms = lambda x: f"{x * 1000:.0f} ms"  # noqa: E731
    return (f"| {name} | {what} | {s['n']} | {ms(s['min'])} | {ms(s['median'])} | "
            f"{ms(s['p99'])} | {ms(s['max'])} |")


def _profiles(profiles: dict[str, Any]) -> list[str]:
    """Where the CPU went in each profiled phase (bench/common/profiling.py)."""
    out: list[str] = []
    for phase, p in profiles.items():
        procs = ", ".join(f"{r['command']} {r['cpu_s']:.2f} s" for r in p["cpu_by_process"][:6])
        out += ["", f"**Where the CPU went: {phase.replace('_', ' ')}** ({p['wall_s']:.2f} s "
                f"wall on {p['cpus']} CPUs = {p['wall_s'] * p['cpus']:.2f} CPU-s; used "
                f"{p['cpu_total_s']:.2f} CPU-s): {procs}."]
        spy = p.get("py_spy")
        if not spy or not spy["samples"]:
            continue
        areas = ", ".join(f"{a['area']} {a['share']:.0%}" for a in spy["by_area"][:8])
        out += ["", f"Operator, py-spy ({spy['samples']} samples at {spy['rate_hz']} Hz = "
                f"{spy['cpu_s']:.2f} s on a CPU), by library (self): {areas}.", "",
                "| our function (inclusive) | file | share |", "|---|---|---|"]
        out += [f"| `{r['function']}` | {r['file']} | {r['share']:.0%} |"
                for r in spy["inclusive"][:12]]
        out += ["", "| function (self) | file | share |", "|---|---|---|"]
        out += [f"| `{r['function']}` | {r['file']} | {r['share']:.0%} |"
                for r in spy["self"][:10]]
    return out


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Rollback reaction time (sandbox)",
        "",
        f"Measured {result['finished']} by `bench/reaction/reaction.py` on {m['nproc']} CPUs "
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
        big = wh.get("big_body")
        if big:
            lines.append(_row(f"webhook, one alert at a time while a {big['alerts']}-alert "
                              "body is handled", big["summary"]["patch_s"],
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
        seq, burst = wh["sequential"]["summary"]["patch_s"], wh["burst"]["summary"]["patch_s"]
        lines += ["", "| target (issue 15) | measured | met |", "|---|---|---|"]
        lines.append(f"| one at a time: p99 ≤ 100 ms over ≥ 200 alerts | p99 "
                     f"{seq.get('p99', 0) * 1000:.0f} ms over {seq['n']} | "
                     f"{'yes' if seq['n'] >= 200 and seq['p99'] <= 0.1 else 'no'} |")
        lines.append(f"| 100 alerts for 100 pools at once: p99 ≤ 1 s | p99 "
                     f"{burst.get('p99', 0) * 1000:.0f} ms over {burst['n']} | "
                     f"{'yes' if burst['n'] >= 100 and burst['p99'] <= 1.0 else 'no'} |")
        big = wh.get("big_body")
        if big:
            during = big["summary"]["patch_s"]
            ok = during.get("n", 0) > 0 and during["p99"] <= 0.1
            lines.append(
                f"| {big['alerts']:,} alerts in one body, other requests not blocked | body "
                f"({big['bytes'] / 1e6:.2f} MB) answered in {big['answer_s']:.2f} s "
                f"({big['answer']}); {during.get('n', 0)} single alerts sent while it was in "
                f"flight: p99 {during.get('p99', 0) * 1000:.0f} ms to their patch | "
                f"{'yes' if ok else 'no'} (≤ 100 ms, as one at a time) |")
        lines += _profiles(wh.get("profiles") or {})
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
