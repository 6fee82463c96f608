"""The real-size sweep: K x batch size x acceptance for a 27B-class hybrid and a 7B-class dense
MTP model, dummy weights, served through `mtp-runtime serve` (the pool's own path).

    python3 realsize.py --kind qwen35-27b --out DIR [--ks 0,1,2,3,4,5,6]
                        [--concurrency 1,4,16,64] [--levels 0.9,0.8,0.6] [--budget-s 540]

Runs on the GPU machine (stdlib + `mtp_runtime` + the carried `measure.py`). Per K: a pool
config as the operator writes it (K fixed, `extraArgs` carrying `--load-format dummy` and the
engine settings), `mtp-runtime serve` starts vLLM; the engine start time is the time to vLLM's
/health; vLLM's own start-up lines give the KV-cache size and its "Maximum concurrency" for
`max_model_len` tokens. Then acceptance is set in place (acceptance_ext.py, through vLLM's
/collective_rpc) at each level, with a level of 0 (no draft ever right: the pure cost of K), and
every concurrency is driven with greedy token-id requests of PROMPT_LEN + max_tokens tokens;
finally one run at the largest concurrency the KV cache holds (capped by --max-num-seqs).
Figures per run come from the counters' increases (mtp_runtime.figures): per-position
acceptance, hit rate, acceptance length; engine steps from `vllm:iteration_tokens_total_count`
(one observation per engine step); the most running/waiting requests seen (gauges polled every
0.2 s); output tokens/s from the client's wall time.

Everything is written as it goes: `results.json` after every run, `expositions.tar.gz` after
every K; a K that would not fit the time box is skipped and said so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import measure  # type: ignore[import-not-found]  # bench/gpu/measure.py, carried alongside
import realsize_models  # type: ignore[import-not-found]

from mtp_runtime import figures

PORT = measure.PORT
MODEL_NAME = "m"
PRODUCT_ENV = "MTP_BENCH_PRODUCT"
PROMPT_LEN = 64
ACCEPT_N = 2048  # ids 0..N-1 carry the controlled acceptance (acceptance_ext.py)
COMMON_ARGS = realsize_models.COMMON_ARGS

MAXCONC_RE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
KVSIZE_RE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
LOADED_RE = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds")


def post(url: str, body: dict, timeout: float = 300.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        text = resp.read().decode()
    return json.loads(text) if text else {}


def set_acceptance(p: float) -> dict:
    reply = post(f"http://127.0.0.1:{PORT}/collective_rpc",
                 {"method": "mtp_bench_set_acceptance", "args": [str(p), str(ACCEPT_N), "7"]})
    return (reply.get("results") or [{}])[0]


def prompts(n: int, seed: int) -> list[list[int]]:
    """Runs of consecutive ids below ACCEPT_N, each from its own start."""
    import random
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = rng.randrange(ACCEPT_N)
        out.append([(s + i) % ACCEPT_N for i in range(PROMPT_LEN)])
    return out


def send(prompt: list[int], max_tokens: int) -> dict:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True}
    return post(f"http://127.0.0.1:{PORT}/v1/completions", body, timeout=600)


class GaugeWatch:
    """Polls vLLM's running/waiting gauges while a run goes; keeps the largest values."""

    def __init__(self) -> None:
        self.max_running = 0.0
        self.max_waiting = 0.0
        self.max_kv_usage = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                text = measure.get(f"http://127.0.0.1:{PORT}/metrics", timeout=5)
                self.max_running = max(self.max_running,
                                       measure.counter_sum(text, "vllm:num_requests_running"))
                self.max_waiting = max(self.max_waiting,
                                       measure.counter_sum(text, "vllm:num_requests_waiting"))
                self.max_kv_usage = max(self.max_kv_usage,
                                        measure.counter_sum(text, "vllm:kv_cache_usage_perc"))
            except OSError:
                pass
            self._stop.wait(0.2)

    def __enter__(self) -> GaugeWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def drive(conc: int, n: int, max_tokens: int, seed: int) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    tokens = 0
    lock = threading.Lock()

    def one(p: list[int]) -> None:
        nonlocal tokens
        t = time.monotonic()
        try:
            reply = send(p, max_tokens)
        except (OSError, ValueError, KeyError) as exc:
            with lock:
                errors.append(repr(exc))
            return
        with lock:
            latencies.append(time.monotonic() - t)
            tokens += int(reply["usage"]["completion_tokens"])

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=conc) as pool:
        list(pool.map(one, prompts(n, seed)))
    wall = time.monotonic() - t0
    if not latencies:
        raise RuntimeError(f"every request failed: {errors[:3]}")
    return {"requests": n, "failed_requests": len(errors), "request_errors": errors[:3],
            "completion_tokens": tokens, "wall_s": round(wall, 4),
            "mean_latency_s": round(sum(latencies) / len(latencies), 4)}


def hist(text: str, name: str) -> float:
    return measure.counter_sum(text, name)


def run_point(k: int, p: float, conc: int, args: argparse.Namespace, store: dict,
              n: int | None = None) -> dict:
    murl = f"http://127.0.0.1:{PORT}/metrics"
    n = n or max(args.min_requests, conc)
    before = measure.get(murl)
    with GaugeWatch() as watch:
        load = drive(conc, n, args.max_tokens, seed=int(1000 * p) + 7 * conc + k)
    after = measure.get(murl)
    tag = f"k{k}-p{p:g}-c{conc}"
    store[f"{tag}-before.prom"] = before
    store[f"{tag}-after.prom"] = after
    fig = figures.figures(after, before)

    def delta(name: str) -> float:
        return hist(after, name) - hist(before, name)

    steps = delta("vllm:iteration_tokens_total_count")
    gen = delta("vllm:generation_tokens_total")
    decode_s = delta("vllm:request_decode_time_seconds_sum")
    prefill_s = delta("vllm:request_prefill_time_seconds_sum")
    out = {"k": k, "p_set": p, "concurrency": conc, **load,
           "output_tokens_per_s": round(load["completion_tokens"] / load["wall_s"], 2),
           "engine_steps": steps, "generation_tokens": gen,
           "time_per_engine_step_ms": round(1000 * load["wall_s"] / steps, 3) if steps else None,
           "tokens_per_engine_step": round(gen / steps, 3) if steps else None,
           "request_decode_time_s_sum": round(decode_s, 4),
           "request_prefill_time_s_sum": round(prefill_s, 4),
           "max_running": watch.max_running, "max_waiting": watch.max_waiting,
           "max_kv_cache_usage": round(watch.max_kv_usage, 4),
           "hit_rate": fig["hit_rate"], "acceptance_rate": fig["acceptance_rate"],
           "mean_acceptance_length": fig["mean_acceptance_length"],
           "position_acceptance_rate": fig["position_acceptance_rate"],
           "drafts": fig["drafts"], "draft_tokens": fig["draft_tokens"],
           "accepted_tokens": fig["accepted_tokens"], "observed_k": fig["num_speculative_tokens"],
           "exposition": tag}
    if conc == 1 and steps > load["requests"]:
        # decode steps only (one prefill step a request), timed by vLLM itself
        out["decode_step_ms_c1"] = round(1000 * decode_s / (steps - load["requests"]), 3)
    return out


def start_facts(log_text: str) -> dict:
    facts: dict = {}
    m = MAXCONC_RE.findall(log_text)
    if m:
        facts["max_concurrency_tokens"] = int(m[-1][0].replace(",", ""))
        facts["max_concurrency"] = float(m[-1][1])
    m = KVSIZE_RE.findall(log_text)
    if m:
        facts["kv_cache_tokens"] = int(m[-1].replace(",", ""))
    m = LOADED_RE.findall(log_text)
    if m:
        facts["weights_gib"] = float(m[-1][0])
        facts["load_s"] = float(m[-1][1])
    for line in log_text.splitlines():
        if "deprecated" in line and "mtp" in line:
            facts["method_note"] = line.strip()[-300:]
        if "Resolved architecture" in line or ("drafter" in line.lower() and "Loading" in line):
            facts.setdefault("arch_lines", []).append(line.strip()[-200:])
    return facts


def pool_config(model: str, kind: str, k: int, extra: list[str], product: str,
                max_model_len: int, model_cache: str = "") -> dict:
    cache = {"model_cache": {"path": model_cache, "kind": "hostPath"}} if model_cache else {}
    return {**cache, "serve": {"model": model, "num_speculative_tokens": k,
                      "method": realsize_models.METHODS[kind],
                      "port": PORT, "tensor_parallel_size": 1,
                      "max_model_len": str(max_model_len), "reasoning_parser": None,
                      "served_model_name": MODEL_NAME, "model_source": "huggingface",
                      "mtp_layers": 1, "extra_args": extra},
            "gpu_product": product, "k_mode": "fixed", "profiles": {}, "cluster_overrides": {},
            "max_speculative_tokens": None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=sorted(realsize_models.KINDS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ks", default="0,1,2,3,4,5,6")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--levels", default="0.9,0.8,0.6")
    ap.add_argument("--cost-level", type=float, default=-1.0,
                    help="a level run at --side-concurrency too (0: no draft ever right); "
                    "negative: none")
    ap.add_argument("--reference", type=float, default=0.8,
                    help="the level run at every concurrency and at the largest batch")
    ap.add_argument("--side-concurrency", default="1,16",
                    help="the concurrencies of the other levels")
    ap.add_argument("--side-ks", default="",
                    help="the K that run the other levels (default: every K >= 1)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--min-requests", type=int, default=2)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--gpu-memory-utilization", default="0.90")
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--model-cache", default="",
                    help="a folder the pool config names as its (hostPath) model cache: the "
                         "runtime then keeps compiled kernels there, as in a pod")
    ap.add_argument("--per-k-estimate", type=float, default=110.0)
    ap.add_argument("--ready-timeout", type=float, default=400.0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/mtp-realsize"))
    ap.add_argument("--compilation", choices=("graphs", "production"), default="graphs",
                    help="graphs: FULL_DECODE_ONLY CUDA graphs without torch.compile (the "
                         "sweep's setting: fast starts, but vLLM then runs the drafter "
                         "without graphs); production: vLLM's default compilation, no "
                         "--compilation-config (results kept apart as variant 'compiled')")
    args = ap.parse_args()
    t_start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    model = realsize_models.write_model(args.kind, args.work / args.kind)
    ks = [int(x) for x in args.ks.split(",") if x]
    concs = [int(x) for x in args.concurrency.split(",") if x]
    levels = [float(x) for x in args.levels.split(",") if x]
    product = os.environ.get(PRODUCT_ENV, "")
    common = list(COMMON_ARGS)
    if args.compilation == "production":
        at = common.index("--compilation-config")
        del common[at:at + 2]
    extra = [*common, *realsize_models.KIND_ARGS[args.kind],
             "--gpu-memory-utilization", args.gpu_memory_utilization,
             "--max-num-seqs", str(args.max_num_seqs)]
    results: dict = {"kind": args.kind, "config": realsize_models.KINDS[args.kind],
                     "method": realsize_models.METHODS[args.kind], "extra_args": extra,
                     "prompt_len": PROMPT_LEN, "max_tokens": args.max_tokens,
                     "max_model_len": args.max_model_len, "accept_n": ACCEPT_N,
                     "runs": [], "servers": [], "skipped": []}
    tag = args.kind
    if args.compilation == "production":
        results["variant"] = "compiled"
        tag = f"{args.kind}-compiled"
    res_path = args.out / f"{tag}-results.json"
    tar_path = args.out / f"{tag}-expositions.tar.gz"
    store: dict[str, str] = {}

    def save() -> None:
        res_path.write_text(json.dumps(results, indent=1))

    per_k = args.per_k_estimate
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    for k in ks:
        elapsed = time.monotonic() - t_start
        if elapsed + per_k > args.budget_s:
            results["skipped"].append({"k": k, "why": f"time box: {elapsed:.0f} s used of "
                                       f"{args.budget_s:.0f} s, a K took ~{per_k:.0f} s"})
            save()
            continue
        t_k = time.monotonic()
        cfg = pool_config(str(model), args.kind, k, extra, product, args.max_model_len,
                          args.model_cache)
        cfg_path = args.work / f"{tag}-k{k}.json"
        cfg_path.write_text(json.dumps(cfg))
        printed = subprocess.run([sys.executable, "-m", "mtp_runtime.cli", "print-args",
                                  "--config", str(cfg_path)], capture_output=True, text=True,
                                 env=env)
        store[f"k{k}-print-args.json"] = printed.stdout + printed.stderr
        info: dict = {"k": k}
        log_path = args.work / f"{tag}-serve-k{k}.log"
        server = measure.Server(cfg_path, log_path, env)
        try:
            info["ready_s"] = round(server.wait_ready(args.ready_timeout), 1)
            info.update(start_facts(log_path.read_text(errors="replace")))
            info["exporter_up"] = measure.wait_exporter_up(20.0)
            info["acceptance_set"] = set_acceptance(args.reference)
            # warm-up: every batch shape once, with rejections, few tokens
            for conc in sorted({*concs}):
                drive(conc, conc, 16, seed=99)
            side = [int(x) for x in args.side_concurrency.split(",") if x]
            order = [(args.reference, concs)]
            side_ks = {int(x) for x in args.side_ks.split(",") if x}
            if k > 0 and (not side_ks or k in side_ks):
                order += [(p, side) for p in levels if p != args.reference]
                if args.cost_level >= 0:
                    order.append((args.cost_level, side))
            for p, point_concs in order:
                set_acceptance(p)
                for conc in point_concs:
                    try:
                        results["runs"].append(run_point(k, p, conc, args, store))
                    except Exception as exc:
                        results["runs"].append({"k": k, "p_set": p, "concurrency": conc,
                                                "error": repr(exc)})
                    save()
            cap = info.get("max_concurrency")
            if cap:
                big = min(int(cap), args.max_num_seqs)
                if big > max(concs):
                    set_acceptance(args.reference)
                    try:
                        run = run_point(k, args.reference, big, args, store)
                        run["largest_batch_run"] = True
                        results["runs"].append(run)
                    except Exception as exc:
                        results["runs"].append({"k": k, "p_set": args.reference,
                                                "concurrency": big, "error": repr(exc)})
            store[f"k{k}-final.prom"] = measure.get(f"http://127.0.0.1:{PORT}/metrics")
            try:
                store[f"k{k}-exporter.prom"] = measure.get(
                    f"http://127.0.0.1:{measure.EXPORTER_PORT}/metrics")
            except OSError as exc:
                info["exporter_error"] = repr(exc)
        except Exception as exc:
            info["error"] = repr(exc)
        finally:
            info["exit_status"] = server.stop()
            info["seconds"] = round(time.monotonic() - t_k, 1)
            log_text = log_path.read_text(errors="replace")
            info.setdefault("max_concurrency", start_facts(log_text).get("max_concurrency"))
            store[f"k{k}-serve.log"] = log_text[-150_000:]
            if "error" in info:
                info["log_tail"] = log_text[-4000:]
            results["servers"].append(info)
            per_k = max(per_k * 0.5, time.monotonic() - t_k)
            save()
            measure.write_tar(tar_path, store)
        print(json.dumps({a: b for a, b in info.items() if a != "log_tail"})[:1500], flush=True)
        if "error" in info and "ready_s" not in info:
            results["stopped"] = f"K={k} did not start; the other K would fail the same way"
            save()
            break
    results["total_s"] = round(time.monotonic() - t_start, 1)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
