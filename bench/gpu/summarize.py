"""Turn what `measure.sh` wrote under $OUT into bench/results/h200.{json,md} and test fixtures.

    python3 bench/gpu/summarize.py DIR [--calls 'smoke=312,sweep=540'] [--bundle-mib 40.1]
    python3 bench/gpu/summarize.py DIR --merge --calls 'sweep2=560'   # add K to the committed run

`--merge` keeps the committed h200.json's runs and servers for every K the new run did not
measure (a device call holds a few K: the K=0..6 table is filled over several calls); it refuses
a run from another GPU, driver, vLLM or torch, where the figures would not be comparable.

DIR holds results.json, env.txt, detect.json, install.json, expositions.tar.gz (as they came
back from the GPU machine). Fixtures: real vLLM 0.26.0 expositions for K=1 and K=4 go to
tests/fixtures/h200-vllm/ (see FIXTURES).
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_DIR = ROOT / "tests" / "fixtures" / "h200-vllm"
CONCURRENCY = (1, 8, 64)
CLASSES = ("predictable", "unpredictable")
# The scrape sequence of one server (one K) kept as fixtures: the state after warm-up, then
# after each run in the order they ran.
SEQUENCE = [("predictable", 1, "before")] + [(c, n, "after") for c in CLASSES
                                              for n in CONCURRENCY]


def fixture_names(k: int) -> list[tuple[str, str]]:
    """(name in expositions.tar.gz, fixture file name) for one K."""
    out = []
    for i, (cls, conc, when) in enumerate(SEQUENCE):
        out.append((f"k{k}-{cls}-c{conc}-{when}.prom",
                    f"k{k}-scrape{i}-{'warmup' if when == 'before' else f'{cls}-c{conc}'}.prom"))
    out.append((f"k{k}-exporter.prom", f"k{k}-exporter.prom"))
    return out


def env_facts(text: str) -> dict[str, str]:
    facts = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("nvidia-smi", "python", "torch", "vllm", "transformers"):
            facts[key.strip()] = value.strip()
        if "Driver Version" in line:
            facts["nvidia-smi-header"] = " ".join(line.strip("| ").split())
    return facts


def fmt(x: object, nd: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def table(runs: list[dict], cls: str) -> list[str]:
    lines = [f"### {cls}", "",
             "| K | concurrency | requests | output tok/s | ms / engine step | tokens / step | "
             "hit rate | mean acceptance length | acceptance by position |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in runs if r.get("traffic") == cls),
                    key=lambda r: (r["k"], r["concurrency"])):
        if "error" in r:
            lines.append(f"| {r['k']} | {r['concurrency']} | failed: {r['error'][:80]} |"
                         " | | | | | |")
            continue
        pos = ", ".join(f"{p:.2f}" for p in r["position_acceptance_rate"]) or "—"
        lines.append(
            f"| {r['k']} | {r['concurrency']} | {r['requests'] - r['failed_requests']} | "
            f"{r['output_tokens_per_s']:.0f} | "
            f"{fmt(r['time_per_engine_step_ms'], 2)} | {fmt(r['tokens_per_engine_step'], 2)} | "
            f"{fmt(r['hit_rate'])} | {fmt(r['mean_acceptance_length'], 2)} | {pos} |")
    return [*lines, ""]


SAME_MACHINE = ("nvidia-smi", "nvidia-smi-header", "vllm", "torch")


def merged(prev: dict, res: dict, env: dict, calls: dict) -> tuple[dict, dict]:
    """`res` (one device call's results.json) with the committed results of the other K."""
    for key in SAME_MACHINE:
        if prev["machine"].get(key) != env.get(key):
            raise SystemExit(f"summarize --merge: {key} differs from the committed run "
                             f"({prev['machine'].get(key)!r} vs {env.get(key)!r}): not comparable")
    new_ks = {r["k"] for r in res["runs"]} | {s["k"] for s in res["servers"]}
    out = dict(res)
    out["runs"] = [r for r in prev["runs"] if r["k"] not in new_ks] + res["runs"]
    out["servers"] = [s for s in prev["servers"] if s["k"] not in new_ks] + res["servers"]
    measured = {r["k"] for r in out["runs"] if "error" not in r}
    out["skipped"] = [s for s in prev["skipped"] + res["skipped"] if s["k"] not in measured]
    return out, {**{k: str(v) for k, v in prev.get("device_calls_s", {}).items()}, **calls}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--calls", default="", help="device calls: name=seconds,...")
    ap.add_argument("--bundle-mib", type=float, default=None)
    ap.add_argument("--fixture-ks", default="1,4")
    ap.add_argument("--root", type=Path, default=ROOT, help="write under this checkout")
    ap.add_argument("--merge", action="store_true",
                    help="keep the committed results for the K this run did not measure")
    args = ap.parse_args()
    root = args.root
    fixture_dir = root / FIXTURE_DIR.relative_to(ROOT)
    d = args.dir
    res = json.loads((d / "results.json").read_text())
    env = env_facts((d / "env.txt").read_text())
    detect = json.loads((d / "detect.json").read_text())
    install = json.loads((d / "install.json").read_text())
    calls = dict(kv.split("=", 1) for kv in args.calls.split(",") if kv)
    if args.merge:
        res, calls = merged(json.loads((root / "bench" / "results" / "h200.json").read_text()),
                            res, env, calls)
    out = {
        "machine": env, "detect": detect,
        "bundle": {"mib": args.bundle_mib, "installed": install.get("installed"),
                   "kept_from_machine": install.get("kept_from_machine"),
                   "install_s": install.get("seconds")},
        "device_calls_s": {k: float(v) for k, v in calls.items()},
        "planned_k_h200": res["planned_k_h200"], "vllm_extra_args": res["extra_args"],
        "max_tokens": res["max_tokens"], "servers": [
            {k: v for k, v in s.items() if k != "log_tail"} for s in res["servers"]],
        "skipped": res["skipped"], "runs": res["runs"],
    }
    (root / "bench" / "results" / "h200.json").write_text(json.dumps(out, indent=1) + "\n")

    md = ["# MTP on a real NVIDIA H200: vLLM 0.26.0 under `mtp-runtime serve`", "",
          f"- GPU: `{env.get('nvidia-smi', '?')}` (`{env.get('nvidia-smi-header', '?')}`)",
          f"- vLLM: {env.get('vllm', '?')}; torch: {env.get('torch', '?')}; "
          f"Python {env.get('python', '?')}",
          f"- vLLM flags added by the pool's `extraArgs`: `{' '.join(res['extra_args'])}`",
          f"- K planned for an H200 pool by the profile table: {res['planned_k_h200']} "
          "(that run used `k_mode: auto`; the other K were `fixed`)",
          f"- Each request: {res['max_tokens']} greedy output tokens (`ignore_eos`), 16-token "
          "prompt (tests/engine/traffic.py); at concurrency c, 2c requests (at least 4), c at "
          "a time; `requests` counts those that succeeded.", ""]
    md += ["**A tiny model's step cost is not a 27B model's.** The model is the project's tiny "
           "MiMo (24 Qwen2 layers of hidden size 256, 22 of them exactly zero, one MTP layer, "
           "about 30 M parameters; `tests/engine/tiny_model.py`). Its target step is a few "
           "milliseconds of mostly kernel-launch overhead, so the draft's fixed cost weighs far "
           "more than on a 27B model, whose decode step is bound by reading ~54 GB of weights. "
           "Speed-ups and slow-downs here say nothing about the K a real model should use; the "
           "acceptance figures say how the counters behave, and the runtime path is real.", ""]
    for cls in CLASSES:
        md += table(res["runs"], cls)
    md += ["Definitions: hit rate c_0/D; mean acceptance length 1 + A/D; acceptance by "
           "position c_j/D (D drafts, A accepted tokens, c_j accepted at position j, from the "
           "increase of vLLM's spec-decode counters over the run); output tok/s = completion "
           "tokens / wall time of the run; ms / engine step = wall time / increase of "
           "`vllm:iteration_tokens_total_count`; tokens / step = increase of "
           "`vllm:generation_tokens_total` / engine steps.", ""]
    md += ["## Servers", "", "| K | k_mode | ready after (s) | server seconds | exit | note |",
           "|---|---|---|---|---|---|"]
    for s in res["servers"]:
        md.append(f"| {s['k']} | {s['k_mode']} | {fmt(s.get('ready_s'))} | "
                  f"{fmt(s.get('seconds'))} | {s.get('exit_status')} | "
                  f"{(s.get('error') or '')[:120]} |")
    for s in res["skipped"]:
        md.append(f"| {s['k']} | — | — | — | — | skipped: {s['why']} |")
    md.append("")
    if calls:
        md += ["## Device calls", ""] + [f"- {k}: {v} s" for k, v in calls.items()] + [""]
    (root / "bench" / "results" / "h200.md").write_text("\n".join(md))

    fixture_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(d / "expositions.tar.gz") as tar:
        names = set(tar.getnames())
        for k in (int(x) for x in args.fixture_ks.split(",")):
            for src, dst in fixture_names(k):
                if src in names:
                    f = tar.extractfile(src)
                    assert f is not None
                    (fixture_dir / dst).write_bytes(f.read())
                else:
                    print(f"summarize: {src} not in the run's expositions")
    # tests/unit/bench/test_h200_vllm_fixtures.py runs on these fixtures
    print("wrote bench/results/h200.json, h200.md and", fixture_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
