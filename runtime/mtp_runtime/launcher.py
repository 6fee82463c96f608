"""Plan the vLLM launch for the GPU this pod got, and run vLLM as a child process.

`plan()` is pure: a PoolConfig plus the detected GPU → the argv/env to run and the facts to
report. `run_child()` runs the argv with signals forwarded (SIGTERM/SIGINT/SIGHUP/SIGQUIT →
vLLM's own graceful shutdown) and returns vLLM's exit status as ours: its exit code, or
128+N when a signal N killed it, so a crash is never hidden from Kubernetes.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from mtp_runtime.engine import LogTail
from mtp_runtime.gpu_detect import GPUInfo
from mtp_runtime.model_cache import ModelCache
from mtp_runtime.pool_config import PoolConfig, same_product
from mtp_runtime.vllm_command import ServeSettings, build_argv, build_env

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


@dataclass(frozen=True)
class LaunchPlan:
    settings: ServeSettings
    argv: list[str]
    env: dict[str, str]  # only what the runtime adds on top of the pod's environment
    gpu: dict[str, object]
    k: dict[str, object]
    mismatch: bool
    model_cache: ModelCache | None = None  # the pool's cache volume (None: no cache)

    def to_dict(self) -> dict[str, object]:
        """What `mtp-runtime print-args` prints: exactly argv, env, gpu, k."""
        return {"argv": self.argv, "env": self.env, "gpu": self.gpu, "k": self.k}


def plan(config: PoolConfig, gpu: GPUInfo) -> LaunchPlan:
    """The launch for `config` on `gpu`. Raises KError/SettingsError (ValueError) when vLLM
    would refuse the settings."""
    mismatch = not same_product(gpu.product, config.gpu_product)
    settings, resolution = config.for_gpu(gpu.product)
    operator_k = config.serve.num_speculative_tokens
    if resolution is not None:
        k_info: dict[str, object] = {
            "k": resolution.k,
            "source": resolution.source,
            "reason": f"{resolution.reason} (re-resolved: the pool was planned for "
                      f"{config.gpu_product}, the pod got {gpu.product})",
        }
    elif mismatch:
        k_info = {
            "k": settings.num_speculative_tokens,
            "source": "operator",
            "reason": f"K fixed by the operator (spec or rollback), kept although the pool was "
                      f"planned for {config.gpu_product} and the pod got {gpu.product}",
        }
    else:
        k_info = {
            "k": settings.num_speculative_tokens,
            "source": "operator",
            "reason": f"as resolved by the operator for {config.gpu_product}",
        }
    k_info.update(mode=config.k_mode, operator_k=operator_k, re_resolved=resolution is not None)
    gpu_info = dict(gpu.to_dict())
    gpu_info.update(expected_product=config.gpu_product, mismatch=mismatch)
    return LaunchPlan(
        settings=settings,
        argv=build_argv(settings),
        env=build_env(settings),
        gpu=gpu_info,
        k=k_info,
        mismatch=mismatch,
        model_cache=config.model_cache,
    )


# vLLM's API server closes an idle HTTP connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE
# seconds (5 by default): shorter than the operator's evaluator interval (15 s), so each of its
# scrapes would open a new connection, which at thousands of pods costs the operator about as
# much CPU as the rest of the scrape (bench/results/evaluator.md). Unless the pod sets it.
HTTP_KEEP_ALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
HTTP_KEEP_ALIVE_SECONDS = 75


def child_environment(base: Mapping[str, str], extra: Mapping[str, str]
                      ) -> tuple[dict[str, str], list[str]]:
    """The environment for vLLM: the pod's, plus `extra`, minus what would break vLLM, and
    an HTTP keep-alive longer than the evaluator's interval unless the pod sets one.

    Kubernetes injects `VLLM_PORT=tcp://IP:PORT` into pods when a Service named `vllm`
    exists in the namespace; vLLM reads VLLM_PORT as its own setting and fails. Such a value
    is dropped (the names dropped are returned so the caller can log them).
    """
    env = dict(base)
    dropped = []
    port = env.get("VLLM_PORT")
    if port is not None and not port.strip().isdigit():
        del env["VLLM_PORT"]
        dropped.append("VLLM_PORT")
    env.setdefault(HTTP_KEEP_ALIVE_ENV, str(HTTP_KEEP_ALIVE_SECONDS))
    env.update(extra)
    return env, dropped


def exit_status(returncode: int) -> int:
    """subprocess's returncode → a shell-style exit status (killed by signal N → 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


def run_child(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    signals: Iterable[signal.Signals] = FORWARDED_SIGNALS,
    on_signal: Callable[[int], bool | None] | None = None,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
    tail: LogTail | None = None,
) -> int:
    """Run `argv` as a child; forward `signals` to it; return its exit status.

    `on_signal(signum)` is called first; when it returns True the signal is not forwarded
    (the caller sends it later, e.g. SIGTERM after draining, through `on_start`'s process).

    The child gets its own session so a terminal's Ctrl-C reaches it once (through us), not
    twice. With `tail`, the child's stdout and stderr pass through pipes to ours and `tail`
    keeps their last lines. Raises FileNotFoundError when argv[0] cannot be found.
    """
    proc: subprocess.Popen[bytes] | None = None
    pending: list[int] = []  # signals that came before the child existed
    previous: dict[int, object] = {}

    def forward(signum: int, _frame: object) -> None:
        if on_signal is not None and on_signal(signum):
            return
        if proc is None:
            pending.append(signum)
        elif proc.poll() is None:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, forward)
        pipe = subprocess.PIPE if tail is not None else None
        proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None,
                                start_new_session=True, stdout=pipe, stderr=pipe)
        if tail is not None:
            tail.pump(proc.stdout, 1)
            tail.pump(proc.stderr, 2)
        for signum in pending:
            proc.send_signal(signum)
        if on_start is not None:
            on_start(proc)
        returncode = _wait(proc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        if proc is not None and proc.poll() is None:  # leaving on an exception: no orphan
            proc.kill()
            proc.wait()
        if tail is not None:
            tail.join()
    return exit_status(returncode)


def _wait(proc: subprocess.Popen[bytes], step_s: float = 0.5) -> int:
    """proc.wait(), in steps: a signal that the kernel hands to another of our threads (the
    exporter's, the log pumps') does not interrupt a wait without a timeout in the main
    thread, and Python runs signal handlers only there, so SIGTERM could wait for vLLM's exit
    (seen as a drain that never began, issue 37). Waiting in steps runs them within one."""
    while True:
        try:
            return proc.wait(timeout=step_s)
        except subprocess.TimeoutExpired:
            continue


def vllm_binary_override(argv: list[str]) -> list[str]:
    """Use $MTP_RUNTIME_VLLM (a path) instead of `vllm` from PATH, when set."""
    binary = os.environ.get("MTP_RUNTIME_VLLM")
    return [binary, *argv[1:]] if binary else argv
