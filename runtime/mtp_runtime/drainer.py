"""Draining a pool pod (the decision is mtp_runtime.drain, the marker mtp_runtime.drain_state):
`serve`'s side (Drainer: /ready, SIGTERM -> drain -> SIGTERM to vLLM) and `mtp-runtime drain`,
the preStop that begins the drain and waits for vLLM's requests to finish."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from mtp_runtime import drain, drain_state
from mtp_runtime.cli_base import EXIT_CONFIG, CLIError, load_config, log
from mtp_runtime.exporter import fetch_text


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


class Drainer:
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
