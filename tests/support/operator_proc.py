"""Runs the real operator (`mtp-operator run`) as a subprocess against the sandbox, for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProcess:
    """`mtp-operator run` with its own metrics port and log file."""

    def __init__(
        self,
        kubeconfig: Path,
        log_dir: Path,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.metrics_port = free_port()
        self.args = list(args)
        self.env = env or {}
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"operator-{self.metrics_port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60, ready: bool = True) -> OperatorProcess:
        """Start and wait until /readyz (acting) or, with ready=False, /healthz (alive)."""
        cmd = [
            sys.executable,
            "-m",
            "mtp_operator.cli",
            "run",
            "--metrics-address",
            f"127.0.0.1:{self.metrics_port}",
            *self.args,
        ]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        self._log = open(self.log_path, "ab")  # closed in stop()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        return self.wait_for("/readyz" if ready else "/healthz", timeout)

    def wait_for(self, path: str, timeout: float) -> OperatorProcess:
        """Until `path` (/readyz, /healthz) answers 200; raises if the process exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url(path), timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"operator not healthy in {timeout}s:\n{self.log_tail()}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.metrics_port}{path}"

    def metric(self, name: str) -> float:
        """Sum of every sample of `name` on the operator's /metrics (0 when absent)."""
        with urllib.request.urlopen(self.url("/metrics"), timeout=5) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)
