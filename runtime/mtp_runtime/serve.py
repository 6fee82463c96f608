"""`mtp-runtime serve`: vLLM with the plan's argv and environment plus this machine's, the
exporter beside it (/metrics, /ready), signals passed on (SIGTERM after the drain), and one
clear line when vLLM dies before it ever served."""

from __future__ import annotations

import argparse
import json
import os
import signal

from mtp_runtime import drain, drain_state, engine, multinode
from mtp_runtime.cli_base import (
    EXIT_CANNOT_RUN,
    EXIT_CONFIG,
    EXIT_NOT_FOUND,
    EXIT_PORT_IN_USE,
    CLIError,
    _write_stderr,
    launch_dict,
    log,
    make_plan,
    model_load,
)
from mtp_runtime.drainer import Drainer, drain_seconds, settle_seconds
from mtp_runtime.exporter import ExporterState, MTPExporter
from mtp_runtime.gpu_detect import GPUInfo
from mtp_runtime.launcher import LaunchPlan, child_environment, run_child, vllm_binary_override

TAIL_LINES = 20


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
    drainer = Drainer(drain_state.state_dir(port), args.vllm_metrics_url or
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
