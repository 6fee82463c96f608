"""A monitoring binary run as a plain local process (the base of monitoring.Prometheus and
monitoring.Alertmanager): free loopback port, temp dir, process group, waits."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PROMETHEUS_BIN = os.environ.get("MTP_PROMETHEUS_BIN", "/usr/bin/prometheus")
ALERTMANAGER_BIN = os.environ.get("MTP_ALERTMANAGER_BIN", "/usr/bin/prometheus-alertmanager")
PROMTOOL_BIN = os.environ.get("MTP_PROMTOOL_BIN", "/usr/bin/promtool")


class MonitoringError(RuntimeError):
    """A process failed to start or a wait timed out; the message carries the log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def binaries_present() -> bool:
    """True when Prometheus, promtool and Alertmanager are installed."""
    return all(os.access(b, os.X_OK) for b in (PROMETHEUS_BIN, ALERTMANAGER_BIN, PROMTOOL_BIN))


def _get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _wait(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            got = pred()
            if got:
                return got
        except Exception as e:  # retried until the deadline
            last_exc = e
        if time.monotonic() >= deadline:
            raise MonitoringError(
                f"timed out after {timeout:.0f} s waiting for {what}"
                + (f" (last error: {last_exc!r})" if last_exc else "")
            )
        time.sleep(interval)


class _Process:
    """A binary run on a free loopback port with its own temp dir; a context manager."""

    name = "process"
    binary = ""

    def __init__(
        self,
        *,
        workdir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        keep_workdir: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"mtp-{self.name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.keep_workdir = keep_workdir
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:40123"""
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        """host:port, as Prometheus target lists want it."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _write_config(self) -> None:
        raise NotImplementedError

    def _args(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 30) -> _Process:
        """Writes the config, starts the process and waits until /-/ready answers 200."""
        if not os.access(self.binary, os.X_OK):
            raise MonitoringError(
                f"{self.binary} not installed; run tests/sandbox/install_monitoring.sh"
            )
        self._write_config()
        log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(
            [self.binary, *self._args(), *self.extra_args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.workdir,
        )
        log.close()

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise MonitoringError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                return _get(self.url + "/-/ready", 1)[0] == 200
            except OSError:
                return False

        try:
            deadline = time.monotonic() + timeout
            while not ready():
                if time.monotonic() > deadline:
                    raise MonitoringError(
                        f"{self.name} not ready in {timeout} s:\n{self.log_tail()}"
                    )
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10) -> None:
        """Stops the process group (SIGTERM, then SIGKILL) and removes an owned workdir."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reload(self) -> None:
        """Rewrites the config and asks the process to reload it (POST /-/reload)."""
        self._write_config()
        req = urllib.request.Request(self.url + "/-/reload", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status != 200:
                raise MonitoringError(f"{self.name} reload: HTTP {r.status}")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
