"""What every `mtp-runtime` command shares: the JSON log line on stderr, CLIError and the exit
statuses (mtp_runtime.cli lists them), the pool configuration and the launch plan for the GPU
this pod got."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from mtp_runtime import engine, gpu_detect
from mtp_runtime.cache_files import CacheEscapeError
from mtp_runtime.gpu_detect import GPUDetectionError, GPUInfo
from mtp_runtime.launcher import LaunchPlan, plan
from mtp_runtime.model_load import ModelLoad
from mtp_runtime.pool_config import ENV_VAR, PoolConfig

EXIT_CONFIG = 2
EXIT_NO_GPU = 3
EXIT_PORT_IN_USE = 4
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127

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
        return ModelLoad(launch.settings, launch.model_cache, os.environ, log,
                         str(launch.gpu.get("product") or ""))
    except CacheEscapeError as exc:
        raise CLIError(EXIT_CONFIG, "model_cache_unsafe", f"cannot start vLLM: {exc}") from exc


def launch_dict(launch: LaunchPlan) -> dict[str, object]:
    """print-args' output: the plan, with the cache's variables in `env`."""
    out = launch.to_dict()
    out["env"] = {**launch.env, **model_load(launch).env}
    return out
