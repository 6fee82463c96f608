"""bench/results/evaluator.json and evaluator.md from a bench/scale/scale_evaluator.py result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scale_common import log

MAX_CORES = 0.25


def write_results(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluator.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "evaluator.md").write_text(markdown(result))
    log(f"wrote {out / 'evaluator.json'} and {out / 'evaluator.md'}")


def _mark(ok: bool) -> str:
    return "met" if ok else "**MISSED**"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def markdown(r: dict[str, Any]) -> str:
    s = r["settings"]
    interval = s["interval"]
    lines = [
        "# The built-in evaluator at scale",
        "",
        f"Run {r['started']} to {r['finished']} by `python bench/scale/scale_evaluator.py` "
        "(part of `make bench`; raw figures in [evaluator.json](evaluator.json)). "
        f"{s['resources']} MTPInferences x 4 GPU products, one Ready pod a pool: "
        f"{s['pods']} pods, each pod's /metrics read every {interval:.0f} s. The evaluator is "
        "the operator's own (control/evaluator.py: run_evaluator with the real Reconciler and "
        "RollbackActions) over an in-memory cluster view; each pod's metric source is a "
        "loopback IP of its own at vLLM's port serving the recorded exposition "
        f"`{Path(s['template']).name}` ({r.get('template_bytes', '?')} bytes) with live "
        "spec-decode counters. Each phase is a process of its own, so its CPU seconds are its "
        "own; the first round of each (connections being opened) is left out.",
        "",
        "| measure | figure | target |",
        "|---|---|---|",
    ]
    modes = (("full", "sources send the whole exposition whatever is asked, as vLLM does"),
             ("names", "sources answer only the name[] asked for (prometheus_client)"))  # fmt: skip
    for mode, text in modes:
        if mode not in r:
            continue
        fl, ev = r[mode]["floor"], r[mode]["evaluator"]
        per_pod = fl["bytes_per_round"] / s["pods"]
        lines += [
            f"| **{mode}**: {text}; {per_pod:,.0f} bytes a pod | | |",
            f"| one round, evaluator (median of {ev['rounds']}; max) | "
            f"{ev['median_round_seconds']:.2f} s ({ev['max_round_seconds']:.2f} s) | "
            f"<= {interval:.0f} s: {_mark(ev['max_round_seconds'] <= interval)} |",
            f"| one round, floor: bare client, same fetches, parses nothing | "
            f"{fl['median_round_seconds']:.2f} s | |",
            f"| evaluator CPU, average over its rounds | {ev['cpu_cores_average']:.3f} of a core "
            f"({ev['cpu_seconds_per_round']:.2f} CPU-s a round) | <= {MAX_CORES}: "
            f"{_mark(ev['cpu_cores_average'] <= MAX_CORES)} |",
            f"| floor CPU | {fl['cpu_cores_average']:.3f} of a core "
            f"({fl['cpu_seconds_per_round']:.2f} CPU-s a round) | |",
            *_aiohttp_row(r[mode].get("floor_aiohttp")),
            f"| ratio evaluator / floor: round time, CPU | "
            f"{_ratio(ev['median_round_seconds'], fl['median_round_seconds'])}, "
            f"{_ratio(ev['cpu_seconds_per_round'], fl['cpu_seconds_per_round'])} | |",
            f"| scrapes that succeeded, per round | {min(ev['ok_per_round'])} of {s['pods']} | |",
            f"| evaluator peak RSS (whole process, with the cluster view) | "
            f"{ev['peak_rss_mib']} MiB | |",
            *_gc_row(ev),
        ]
    f = r.get("faults")
    if f:
        k, d = f["kinds"], f["decisions"]
        lines += [
            f"| **faults**: {k['dead']} pods dead (refused), {k['hang']} hanging (never "
            f"answer), {k['slow']} slow ({s['slow_seconds']:.0f} s); whole expositions | "
            "| |",
            f"| one round (median; max): ends with the hanging pods' time-outs | "
            f"{f['median_round_seconds']:.2f} s ({f['max_round_seconds']:.2f} s) | "
            f"<= {interval:.0f} s: {_mark(f['max_round_seconds'] <= interval)} |",
            f"| until every healthy pod was read (median; max) | "
            f"{f['median_healthy_pods_done_seconds']:.2f} s "
            f"({max(f['healthy_pods_done_seconds']):.2f} s) | |",
            f"| evaluator CPU, average | {f['cpu_cores_average']:.3f} of a core | "
            f"<= {MAX_CORES}: {_mark(f['cpu_cores_average'] <= MAX_CORES)} |",
            *_gc_row(f),
            f"| threshold crossing -> decision, {d['decided']} of {d['crossings']} crossings "
            f"(p50; p99; max) | {d['p50']} s; {d['p99']} s; {d['max']} s | p99 <= "
            f"{interval:.0f} s: {_mark(d['p99'] is not None and d['p99'] <= interval and not d['missing'])} |",  # noqa: E501
        ]
    lines += [
        "",
        "## How",
        "",
        f"- Counters: every pod drafts {s['drafts_per_second']:.0f} times a second with "
        f"per-position acceptance {s['acceptance']}; `rollback`: "
        + ", ".join(f"{k} {v}" for k, v in s["rollback"].items())
        + ". A degraded pool's pod stops accepting at a random moment; its hit rate over the "
        "window [t-W, t] is then p(d-t+W)/W, so it crosses minHitRate h at d + W(1 - h/p), "
        "exactly (the sources' counters are that closed form, floored to whole numbers). The "
        "decision is the moment the evaluator hands the signal to the rollback actions "
        "(which then patch the pool through the in-memory cluster).",
        "- The evaluator reads each pod once a round; rounds start every interval and within "
        "one the pools start one after the other over half of it, each at the same place "
        "every round. A crossing waits for the pod's next read: up to one interval, "
        "uniformly; the p99 of that alone is 0.99 of the interval, what the evaluator adds "
        "is the rest. A round's time is from its start to its last pool's end (so at least "
        "half the interval).",
        _keepalive(s.get("keepalive_seconds", 0), interval),
        "- Floor: the same URLs and headers, the same concurrency "
        "(MAX_PARALLEL_SCRAPES) and time-out, bodies read and dropped, through the "
        "evaluator's own HTTP client (adapters/keepalive_http.py: one kept-alive connection a "
        "pod, the answer framed by an asyncio.Protocol); the aiohttp floor makes the same "
        "fetches through aiohttp's client, the evaluator's transport before.",
        "- The metric sources (bench/scale/scale_sources.py) run in one process beside the "
        "evaluator on the same 2 CPUs; their CPU is not the evaluator's.",
        *[f"- {n}" for n in r.get("notes") or []],
        "",
    ]
    return "\n".join(lines)


def _gc_row(phase: dict[str, Any]) -> list[str]:
    full = (phase.get("raw") or {}).get("gc", {}).get("2")
    if not full:
        return []
    return [f"| the collector's full passes from the evaluator's start (control/heap.py "
            f"refreezes 30 s in: one full pass) | {full['passes']}, "
            f"{full['seconds']:.2f} s in all, longest {full['longest_seconds']:.2f} s | |"]


def _aiohttp_row(fl: dict[str, Any] | None) -> list[str]:
    if not fl:
        return []
    return [f"| floor through aiohttp's client (same fetches) | {fl['cpu_cores_average']:.3f} "
            f"of a core ({fl['cpu_seconds_per_round']:.2f} CPU-s a round); round "
            f"{fl['median_round_seconds']:.2f} s | |"]  # fmt: skip


def _keepalive(seconds: float, interval: float) -> str:
    if seconds and seconds < interval:
        return (f"- The sources close a connection idle for {seconds:g} s (vLLM's own "
                "default), so every read opens a new connection.")  # fmt: skip
    if seconds:
        return (f"- The sources close a connection idle for {seconds:g} s, as vLLM does when "
                "mtp-runtime starts it (VLLM_HTTP_TIMEOUT_KEEP_ALIVE=75): each pod's "
                "connection is reused from round to round.")  # fmt: skip
    return "- The sources never close an idle connection."
