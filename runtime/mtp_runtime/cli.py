"""`mtp-runtime`: launch vLLM for the GPU this pod got, and export MTP health metrics.

    mtp-runtime serve      [--config FILE] [--dry-run] [--cpu-dry-run] [--assume-gpu PRODUCT]
                           [--no-exporter] [--exporter-port 9400] [--window 300]
    mtp-runtime print-args [--config FILE] [--cpu-dry-run] [--assume-gpu PRODUCT]
    mtp-runtime detect
    mtp-runtime stats FILE|URL|-
    mtp-runtime exporter   --vllm-url URL [--port 9400] [--window 300]

The pool configuration is the JSON in env MTP_RUNTIME_CONFIG (or --config FILE). Logs go to
stderr, one JSON object per line; results (print-args, detect, stats) go to stdout as JSON.
Exit status: vLLM's own (128+N when killed by signal N); 2 bad configuration; 3 no GPU
detected; 127 vLLM not found.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from mtp_runtime import __version__, exposition, figures, gpu_detect
from mtp_runtime.exporter import (
    DEFAULT_INTERVAL_S,
    DEFAULT_PORT,
    DEFAULT_WINDOW_S,
    ExporterState,
    MTPExporter,
    fetch_text,
)
from mtp_runtime.gpu_detect import GPUDetectionError, GPUInfo
from mtp_runtime.launcher import (
    LaunchPlan,
    child_environment,
    plan,
    run_child,
    vllm_binary_override,
)
from mtp_runtime.pool_config import ENV_VAR, PoolConfig

EXIT_CONFIG = 2
EXIT_NO_GPU = 3
EXIT_NOT_FOUND = 127

_log_lock = threading.Lock()


def log(event: str, level: str = "info", **fields: object) -> None:
    record = {"ts": round(time.time(), 3), "level": level, "logger": "mtp-runtime",
              "event": event, **fields}
    with _log_lock:
        print(json.dumps(record, default=str), file=sys.stderr, flush=True)


class CLIError(Exception):
    def __init__(self, code: int, event: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.event = event


def load_config(path: str | None) -> PoolConfig:
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise CLIError(EXIT_CONFIG, "config_error", f"cannot read {path}: {exc}") from exc
        where = path
    else:
        text = os.environ.get(ENV_VAR, "")
        where = f"${ENV_VAR}"
        if not text.strip():
            raise CLIError(EXIT_CONFIG, "config_error",
                           f"no pool configuration: set {ENV_VAR} (JSON) or pass --config FILE")
    try:
        return PoolConfig.from_json(text)
    except (ValueError, TypeError, KeyError) as exc:
        raise CLIError(EXIT_CONFIG, "config_error", f"invalid pool configuration in {where}: "
                       f"{exc}") from exc


def gpu_for(args: argparse.Namespace, config: PoolConfig | None) -> GPUInfo:
    if getattr(args, "assume_gpu", None):
        return gpu_detect.assumed(args.assume_gpu)
    if getattr(args, "cpu_dry_run", False):
        if config is None:
            raise CLIError(EXIT_CONFIG, "config_error", "--cpu-dry-run needs a pool config")
        return gpu_detect.assumed(config.gpu_product)
    try:
        return gpu_detect.detect()
    except GPUDetectionError as exc:
        raise CLIError(EXIT_NO_GPU, "no_gpu", str(exc)) from exc


def make_plan(args: argparse.Namespace) -> LaunchPlan:
    config = load_config(args.config)
    gpu = gpu_for(args, config)
    try:
        launch = plan(config, gpu)
    except ValueError as exc:  # KError, SettingsError
        raise CLIError(EXIT_CONFIG, "invalid_settings", str(exc)) from exc
    tp = launch.settings.tensor_parallel_size
    if gpu.source != "config" and tp > gpu.count:
        log("too_few_gpus", level="warning", tensor_parallel_size=tp, visible_gpus=gpu.count,
            message="vLLM needs one GPU per tensor-parallel rank; it will fail to start")
    if launch.mismatch:
        log("gpu_mismatch", level="warning", expected=config.gpu_product,
            detected=gpu.product, k=launch.k["k"], operator_k=launch.k["operator_k"],
            k_mode=config.k_mode, reason=launch.k["reason"])
    return launch


def cmd_print_args(args: argparse.Namespace) -> int:
    launch = make_plan(args)
    print(json.dumps(launch.to_dict(), indent=2))
    return 0


def cmd_detect(args: argparse.Namespace) -> int:
    gpu = gpu_for(args, None)
    print(json.dumps(gpu.to_dict(), indent=2))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    source = args.source
    try:
        if source == "-":
            text = sys.stdin.read()
        elif source.startswith(("http://", "https://")):
            text = fetch_text(source, timeout=args.timeout)
        else:
            text = Path(source).read_text()
        result = figures.stats(text)
    except (OSError, exposition.ParseError) as exc:
        raise CLIError(1, "stats_error", f"cannot read {source}: {exc}") from exc
    print(json.dumps(result, indent=2))
    return 0


def _exporter_for(launch: LaunchPlan, args: argparse.Namespace) -> MTPExporter:
    url = args.vllm_metrics_url or f"http://127.0.0.1:{launch.settings.port}/metrics"
    gpu = launch.gpu
    state = ExporterState(
        configured_k=launch.settings.num_speculative_tokens,
        gpu=GPUInfo(product=str(gpu["product"]), name=str(gpu["name"]),
                    count=int(gpu["count"]),  # type: ignore[call-overload]
                    memory_mib=gpu["memory_mib"],  # type: ignore[arg-type]
                    source=str(gpu["source"])),
        expected_product=str(gpu["expected_product"]),
        gpu_mismatch=launch.mismatch,
        k_source=str(launch.k["source"]),
        k_mode=str(launch.k["mode"]),
    )
    return MTPExporter(url, window_s=args.window, interval_s=args.scrape_interval, state=state,
                       on_event=lambda event, **kw: log(event, level="warning", **kw))


def cmd_serve(args: argparse.Namespace) -> int:
    launch = make_plan(args)
    if args.dry_run or args.cpu_dry_run:
        print(json.dumps(launch.to_dict(), indent=2))
        return 0
    argv = vllm_binary_override(launch.argv)
    env, dropped = child_environment(os.environ, launch.env)
    if dropped:
        log("env_dropped", level="warning", names=dropped,
            reason="a Service named 'vllm' injects VLLM_PORT=tcp://..., which breaks vLLM")
    log("launch", argv=argv, env=launch.env, gpu=launch.gpu, k=launch.k)
    exporter = None
    if not args.no_exporter:
        exporter = _exporter_for(launch, args)
        try:
            exporter.start(host=args.exporter_host, port=args.exporter_port)
            log("exporter_started", port=exporter.port, scrapes=exporter.url,
                window_s=args.window)
        except OSError as exc:  # the exporter must never keep vLLM from running
            log("exporter_failed", level="error", error=str(exc), port=args.exporter_port)
            exporter = None
    try:
        status = run_child(argv, env,
                           on_signal=lambda s: log("signal_forwarded", signal=int(s)))
    except FileNotFoundError as exc:
        raise CLIError(EXIT_NOT_FOUND, "vllm_not_found",
                       f"cannot run {argv[0]!r}: {exc}") from exc
    finally:
        if exporter is not None:
            exporter.stop()
    log("vllm_exited", level="info" if status == 0 else "error", exit_status=status)
    return status


def cmd_exporter(args: argparse.Namespace) -> int:
    state = ExporterState()
    if args.config or os.environ.get(ENV_VAR):
        config = load_config(args.config)
        state.configured_k = config.serve.num_speculative_tokens
        state.expected_product = config.gpu_product
    exporter = MTPExporter(args.vllm_url, window_s=args.window, interval_s=args.scrape_interval,
                           state=state,
                           on_event=lambda event, **kw: log(event, level="warning", **kw))
    exporter.start(host=args.host, port=args.port)
    log("exporter_started", port=exporter.port, scrapes=args.vllm_url, window_s=args.window)
    stop = threading.Event()
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    exporter.stop()
    return 0


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help=f"pool configuration JSON file (default: env {ENV_VAR})")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="no GPU needed: take the pool's gpu_product as detected and print "
                        "what would run, without running it")
    p.add_argument("--assume-gpu", metavar="PRODUCT",
                   help="skip detection and take PRODUCT (e.g. NVIDIA-H100-80GB-HBM3) as the "
                        "GPU; for tests and machines without NVML")


def _window_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--window", type=float, default=DEFAULT_WINDOW_S, metavar="SECONDS",
                   help="sliding window of the MTP figures (default 300)")
    p.add_argument("--scrape-interval", type=float, default=DEFAULT_INTERVAL_S,
                   metavar="SECONDS", help="how often vLLM's /metrics is scraped (default 15)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtp-runtime", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=f"mtp-runtime {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="detect the GPU, then run vLLM with MTP and the exporter")
    _config_args(s)
    s.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    s.add_argument("--no-exporter", action="store_true", help="do not start the exporter")
    s.add_argument("--exporter-port", type=int, default=DEFAULT_PORT)
    s.add_argument("--exporter-host", default="0.0.0.0")
    s.add_argument("--vllm-metrics-url", default=None,
                   help="default: http://127.0.0.1:<serve port>/metrics")
    _window_args(s)
    s.set_defaults(func=cmd_serve)

    a = sub.add_parser("print-args", help="print the argv/env/gpu/k JSON serve would use")
    _config_args(a)
    a.set_defaults(func=cmd_print_args)

    d = sub.add_parser("detect", help="print the detected GPU as JSON")
    d.set_defaults(func=cmd_detect)

    st = sub.add_parser("stats", help="MTP figures of one vLLM /metrics exposition (since start)")
    st.add_argument("source", help="a file, an http(s) URL, or - for stdin")
    st.add_argument("--timeout", type=float, default=10.0)
    st.set_defaults(func=cmd_stats)

    e = sub.add_parser("exporter", help="run only the MTP metrics exporter")
    e.add_argument("--vllm-url", required=True, help="vLLM's /metrics URL")
    e.add_argument("--port", type=int, default=DEFAULT_PORT)
    e.add_argument("--host", default="0.0.0.0")
    e.add_argument("--config", metavar="FILE", help="pool configuration (for configured K)")
    _window_args(e)
    e.set_defaults(func=cmd_exporter)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CLIError as exc:
        log(exc.event, level="error", error=str(exc))
        print(f"mtp-runtime: {exc}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    raise SystemExit(main())
