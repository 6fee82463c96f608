"""The H200 sweep: `mtp-runtime serve` running real vLLM with MTP, driven by both traffic classes.

    python3 measure.py --model DIR --out DIR [--ks 0,1,2,3,4,5,6] [--concurrency 1,8,64]
                       [--budget-s 420] [--vllm /path/to/vllm]

Runs on the GPU machine (stdlib + `mtp_runtime` + `traffic`). For each K it writes a pool
config for NVIDIA-H200 (the profile table's K for the planned pool, `fixed` K for the other
sweep points), starts `python -m mtp_runtime.cli serve` (which detects the GPU, starts vLLM and
the MTP exporter), sends every traffic class at every concurrency, and scrapes vLLM's real
`/metrics` before and after each run. Figures per run, from the counters' increases:
acceptance by position (c_j / D), hit rate, mean acceptance length (1 + A / D), output tokens
per second (completion tokens / wall time) and time per engine step (wall time / increase of
`vllm:iteration_tokens_total_count`, vLLM's one-observation-per-engine-step histogram).

Everything is written as it goes: `results.json` after every run, and `expositions.tar.gz`
(every exposition, the exporter's output, the server logs) after every K, so a failure or the
time box (--budget-s; a K that would not fit is skipped and said so) still leaves data.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import traffic  # type: ignore[import-not-found]  # tests/engine/traffic.py, carried alongside

from mtp_runtime import exposition, figures, gpu_profiles

PORT = 8000
EXPORTER_PORT = 9400
MODEL_NAME = "tiny"
PRODUCT = "NVIDIA-H200"


def get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def counter_sum(text: str, name: str) -> float:
    return sum(s.value for s in exposition.parse_exposition(text).samples if s.name == name)


def pool_config(model: str, k: int | None, extra: list[str]) -> dict:
    """k None: the pool as the operator plans it for an H200 (K from the profile table)."""
    if k is None:
        k = gpu_profiles.resolve_k(PRODUCT, gpu_profiles.KRequest()).k
        mode = "auto"
    else:
        mode = "fixed"
    return {"serve": {"model": model, "num_speculative_tokens": k, "method": "mtp",
                      "port": PORT, "tensor_parallel_size": 1, "max_model_len": "128",
                      "reasoning_parser": None, "served_model_name": MODEL_NAME,
                      "model_source": "huggingface", "mtp_layers": None,
                      "extra_args": extra},
            "gpu_product": PRODUCT, "k_mode": mode, "profiles": {}, "cluster_overrides": {},
            "max_speculative_tokens": None}


class Server:
    def __init__(self, cfg_path: Path, log_path: Path, env: dict[str, str],
                 assume_gpu: str | None = None) -> None:
        self.log_path = log_path
        self.log = open(log_path, "wb")
        more = ["--assume-gpu", assume_gpu] if assume_gpu else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mtp_runtime.cli", "serve", "--config", str(cfg_path),
             "--exporter-port", str(EXPORTER_PORT), "--exporter-host", "127.0.0.1",
             "--scrape-interval", "1", "--window", "3600", *more],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_ready(self, timeout: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before ready")
            try:
                get(f"http://127.0.0.1:{PORT}/health", timeout=2)
                return time.monotonic() - t0
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"server not ready after {timeout:.0f} s")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the runtime forwards it to vLLM
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()
        return self.proc.returncode


def wait_exporter_up(timeout: float) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            text = get(f"http://127.0.0.1:{EXPORTER_PORT}/metrics", timeout=2)
            if counter_sum(text, "mtp_runtime_vllm_up") == 1.0:
                return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return False


def drive(cls: str, concurrency: int, n: int, max_tokens: int, seed: int) -> dict:
    prompts = traffic.prompts(cls, n, seed=seed)
    base = f"http://127.0.0.1:{PORT}"
    latencies: list[float] = []
    errors: list[str] = []

    def one(p: list[int]) -> int:
        t = time.monotonic()
        try:
            reply = traffic.send(base, MODEL_NAME, p, max_tokens, timeout=120)
        except (OSError, ValueError, KeyError) as exc:
            errors.append(repr(exc))
            return 0
        latencies.append(time.monotonic() - t)
        return int(reply["usage"]["completion_tokens"])

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        tokens = sum(pool.map(one, prompts))
    wall = time.monotonic() - t0
    if not latencies:
        raise RuntimeError(f"every request failed: {errors[:3]}")
    return {"requests": n, "failed_requests": len(errors), "request_errors": errors[:3],
            "completion_tokens": tokens, "wall_s": round(wall, 4),
            "mean_latency_s": round(sum(latencies) / len(latencies), 4)}


def run_point(k: int, cls: str, conc: int, args: argparse.Namespace, store: dict) -> dict:
    murl = f"http://127.0.0.1:{PORT}/metrics"
    before = get(murl)
    n = max(args.min_requests, 2 * conc)
    load = drive(cls, conc, n, args.max_tokens, seed=1000 * k + conc)
    after = get(murl)
    tag = f"k{k}-{cls}-c{conc}"
    store[f"{tag}-before.prom"] = before
    store[f"{tag}-after.prom"] = after
    fig = figures.figures(after, before)
    steps = counter_sum(after, "vllm:iteration_tokens_total_count") - counter_sum(
        before, "vllm:iteration_tokens_total_count")
    gen = counter_sum(after, "vllm:generation_tokens_total") - counter_sum(
        before, "vllm:generation_tokens_total")
    return {"k": k, "traffic": cls, "concurrency": conc, **load,
            "output_tokens_per_s": round(load["completion_tokens"] / load["wall_s"], 1),
            "engine_steps": steps, "generation_tokens": gen,
            "time_per_engine_step_ms": round(1000 * load["wall_s"] / steps, 4) if steps else None,
            "tokens_per_engine_step": round(gen / steps, 3) if steps else None,
            "hit_rate": fig["hit_rate"], "acceptance_rate": fig["acceptance_rate"],
            "mean_acceptance_length": fig["mean_acceptance_length"],
            "position_acceptance_rate": fig["position_acceptance_rate"],
            "drafts": fig["drafts"], "draft_tokens": fig["draft_tokens"],
            "accepted_tokens": fig["accepted_tokens"],
            "error_propagation_rate": fig["error_propagation_rate"],
            "observed_k": fig["num_speculative_tokens"], "exposition": tag}


def write_tar(path: Path, store: dict[str, str]) -> None:
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name, text in store.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ks", default="0,1,2,3,4,5,6")
    ap.add_argument("--planned-k", action="store_true",
                    help="run the profile table's K for H200 as k_mode auto (the planned pool)")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--classes", default=",".join(traffic.CLASSES))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--min-requests", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--ready-timeout", type=float, default=180.0)
    ap.add_argument("--extra", default="--attention-backend TRITON_ATTN --enforce-eager "
                    "--gpu-memory-utilization 0.25 --max-num-seqs 64 --seed 0")
    ap.add_argument("--assume-gpu", default=None,
                    help="pass --assume-gpu to the runtime (plumbing checks on a machine "
                    "without a GPU); never on the GPU machine")
    ap.add_argument("--work", type=Path, default=Path("/tmp/mtp-measure"))
    args = ap.parse_args()
    t_start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    planned_k = gpu_profiles.resolve_k(PRODUCT, gpu_profiles.KRequest()).k
    ks = [int(x) for x in args.ks.split(",") if x != ""]
    concs = [int(x) for x in args.concurrency.split(",")]
    classes = args.classes.split(",")
    results: dict = {"planned_k_h200": planned_k, "extra_args": args.extra.split(),
                     "max_tokens": args.max_tokens, "runs": [], "servers": [], "skipped": []}
    store: dict[str, str] = {}
    res_path = args.out / "results.json"
    tar_path = args.out / "expositions.tar.gz"

    def save() -> None:
        res_path.write_text(json.dumps(results, indent=1))

    per_k_estimate = 60.0
    for k in ks:
        elapsed = time.monotonic() - t_start
        if elapsed + per_k_estimate > args.budget_s:
            results["skipped"].append({"k": k, "why": f"time box: {elapsed:.0f} s used of "
                                       f"{args.budget_s:.0f} s, a K took ~{per_k_estimate:.0f} s"})
            save()
            continue
        t_k = time.monotonic()
        planned = args.planned_k and k == planned_k
        cfg = pool_config(args.model, None if planned else k, args.extra.split())
        cfg_path = args.work / f"pool-k{k}.json"
        cfg_path.write_text(json.dumps(cfg))
        env = dict(os.environ)
        printed = subprocess.run([sys.executable, "-m", "mtp_runtime.cli", "print-args",
                                  "--config", str(cfg_path)], capture_output=True, text=True,
                                 env=env)
        store[f"k{k}-print-args.json"] = printed.stdout + printed.stderr
        server_info: dict = {"k": k, "k_mode": cfg["k_mode"]}
        log_path = args.work / f"serve-k{k}.log"
        server = Server(cfg_path, log_path, env, args.assume_gpu)
        try:
            server_info["ready_s"] = round(server.wait_ready(args.ready_timeout), 1)
            # the exporter's first good scrape before any traffic: its window then holds
            # every draft of this server
            server_info["exporter_up"] = wait_exporter_up(20.0)
            drive("predictable", 2, 2, args.max_tokens, seed=999)  # warm-up
            for cls in classes:
                for conc in concs:
                    try:
                        results["runs"].append(run_point(k, cls, conc, args, store))
                    except Exception as exc:
                        results["runs"].append({"k": k, "traffic": cls, "concurrency": conc,
                                                "error": repr(exc)})
                    save()
            try:
                time.sleep(2.5)  # > the exporter's scrape interval: it has seen the last run
                store[f"k{k}-exporter.prom"] = get(f"http://127.0.0.1:{EXPORTER_PORT}/metrics")
                store[f"k{k}-final.prom"] = get(f"http://127.0.0.1:{PORT}/metrics")
                stats = subprocess.run([sys.executable, "-m", "mtp_runtime.cli", "stats",
                                        f"http://127.0.0.1:{PORT}/metrics"],
                                       capture_output=True, text=True, env=env, timeout=30)
                server_info["stats"] = json.loads(stats.stdout) if stats.returncode == 0 \
                    else stats.stderr[-2000:]
            except Exception as exc:
                server_info["final_scrape_error"] = repr(exc)
        except Exception as exc:
            server_info["error"] = repr(exc)
        finally:
            server_info["exit_status"] = server.stop()
            server_info["seconds"] = round(time.monotonic() - t_k, 1)
            log_text = log_path.read_text(errors="replace")
            store[f"k{k}-serve.log"] = log_text[-200_000:]
            if "error" in server_info:
                server_info["log_tail"] = log_text[-3000:]
            results["servers"].append(server_info)
            per_k_estimate = max(per_k_estimate, time.monotonic() - t_k)
            save()
            write_tar(tar_path, store)
        print(json.dumps({k2: v for k2, v in server_info.items() if k2 != "log_tail"}),
              flush=True)
    results["total_s"] = round(time.monotonic() - t_start, 1)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
