#!/usr/bin/env python3
"""The sweeps of several runs of bench/tuning/tuning.py, pooled per traffic class and K.

One run's sweep ranks K on 3-6 rounds of one window each; where the Ks of a class lie within
a window's noise of each other (unpredictable traffic on two shared CPU cores: ±10-15 % a
window) those rounds decide the "best K" by chance, and the next run names another one. This
reads the runs' raw sweep windows (the ratio of K's output per engine CPU-second to the
reference K's, same window), pools every round of every run given, and reports per class the
median ratio of each K with its spread, the pooled best K, and each run's tuner result as a
share of that pooled best (beside the share its own sweep gave it). Runs must share their
engine settings (replicas, concurrency, tokens, window, reference K); the script refuses
others.

    python bench/tuning/tuning_pooled.py bench/results/tuning-run{3,4,5,6}.json \
        --out bench/results/tuning-pooled
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

SAME = ("concurrency", "max_tokens", "window_s", "replicas", "worker_core_per_replica")


def tuner_runs(c: dict[str, Any]) -> list[dict[str, Any]]:
    """A class's tuner runs: `tuner_runs` (--repeats), or the one `tuner` of runs 1-7."""
    return c.get("tuner_runs") or ([c["tuner"]] if "tuner" in c else [])


def ratios(sweep_k: dict[str, Any]) -> list[float]:
    """One K's sweep rounds as ratios to the reference K in the same window."""
    return [w["k"]["output_tokens_per_cpu_s"] / w["ref"]["output_tokens_per_cpu_s"]
            for w in sweep_k["windows"]]


def quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def pool(runs: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    first = runs[0][1]
    for name, r in runs[1:]:
        for key in SAME:
            if r["settings"].get(key) != first["settings"].get(key):
                raise SystemExit(f"{name}: settings.{key} = {r['settings'].get(key)!r}, "
                                 f"not {first['settings'].get(key)!r} as in {runs[0][0]}")
        if r["profile_k"] != first["profile_k"]:
            raise SystemExit(f"{name}: reference K {r['profile_k']}, not {first['profile_k']}")
    out: dict[str, Any] = {"runs": [n for n, _ in runs], "reference_k": first["profile_k"],
                           "settings": {k: first["settings"][k] for k in SAME}, "classes": {}}
    classes = sorted({c for _, r in runs for c in r["classes"]})
    for cls in classes:
        per_k: dict[int, list[float]] = {}
        for _, r in runs:
            sweep = (r["classes"].get(cls) or {}).get("sweep") or {}
            for k, entry in sweep.items():
                per_k.setdefault(int(k), []).extend(ratios(entry))
        table = {}
        for k in sorted(per_k):
            xs = per_k[k]
            lo, hi = quartiles(xs)
            table[k] = {"median": round(statistics.median(xs), 4), "rounds": len(xs),
                        "q1": round(lo, 4), "q3": round(hi, 4)}
        best = max(table, key=lambda k: table[k]["median"])
        tuned = []
        for name, r in runs:
            c = r["classes"].get(cls)
            reps = tuner_runs(c) if c else []
            for i, t in enumerate(reps):
                final = t["final_k"]
                share = (table[final]["median"] / table[best]["median"] if final in table
                         else None)
                tuned.append({"run": name if len(reps) == 1 else f"{name} ({i + 1}/{len(reps)})",
                              "final_k": final, "own_best_k": c["best_k"],
                              "own_share": t["share"], "pooled_share": round(share, 4)
                              if share is not None else None, "trials": t["trials"],
                              "stayed": t["stayed"]})
        out["classes"][cls] = {"sweep": table, "best_k": best, "tuners": tuned}
    return out


def markdown(res: dict[str, Any]) -> str:
    ref = res["reference_k"]
    st = res["settings"]
    lines = [
        "# Measured K: the sweeps of several runs pooled", "",
        f"Runs: {', '.join(res['runs'])} (each `python bench/tuning/tuning.py`; same engine "
        f"settings: {st['replicas']} replicas, {st['concurrency']} requests in flight each, "
        f"{st['max_tokens']} output tokens, windows of {st['window_s']} s). Produced by "
        "`python bench/tuning/tuning_pooled.py`. Each sweep round is one window of K beside the "
        f"reference K={ref} in the same window, as output per engine CPU-second; the pooled "
        "figure is the median of every round of every run, with its quartiles.", ""]
    for cls, c in res["classes"].items():
        lines += [f"## {cls}", "", "| K | median x K=" + str(ref) + " | quartiles | rounds |",
                  "|---|---|---|---|"]
        for k, e in c["sweep"].items():
            mark = " (best)" if k == c["best_k"] else ""
            lines.append(f"| {k}{mark} | {e['median']:.3f} | {e['q1']:.3f}-{e['q3']:.3f} | "
                         f"{e['rounds']} |")
        lines += ["", "| run | its sweep's best K | tuner's K | share (own sweep) | "
                  "share (pooled) | trials | stayed |", "|---|---|---|---|---|---|---|"]
        for t in c["tuners"]:
            pooled = f"{t['pooled_share'] * 100:.1f} %" if t["pooled_share"] else "-"
            lines.append(f"| {t['run']} | K={t['own_best_k']} | K={t['final_k']} | "
                         f"{t['own_share'] * 100:.1f} % | {pooled} | "
                         f"{len(t['trials'])} ({', '.join(map(str, t['trials']))}) | "
                         f"{'yes' if t['stayed'] else 'no'} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="tuning.json files of bench/tuning/tuning.py")
    ap.add_argument("--out", help="write OUT.json and OUT.md (default: print the table)")
    args = ap.parse_args()
    runs = [(Path(p).stem, json.loads(Path(p).read_text())) for p in args.runs]
    res = pool(runs)
    md = markdown(res)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(res, indent=1) + "\n")
        Path(args.out + ".md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
