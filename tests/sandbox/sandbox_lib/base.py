"""The sandbox's paths, state file, lock, build, and requests to its apiserver."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox_lib.common import (
    BUILD_SH,
    COMPONENTS,
    NODES_YAML,
    POD_CIDR,
    REPO,
    _log,
)


class SandboxBase:
    """Paths and state of one sandbox (`sandbox.Sandbox` adds components and up/down)."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        nodes_file: str | os.PathLike[str] | None = None,
        bin_dir: str | os.PathLike[str] | None = None,
        extra_args: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """`extra_args`: more flags per component, e.g. {"kube-controller-manager":
        ["--kube-api-qps=200"]} (used on every start of that component by this object)."""
        self.extra_args = {k: list(v) for k, v in (extra_args or {}).items()}
        self.state_dir = Path(
            state_dir or os.environ.get("MTP_SANDBOX_DIR") or REPO / ".sandbox"
        ).resolve()
        self.nodes_file = Path(nodes_file or NODES_YAML)
        self._bin_dir = Path(bin_dir) if bin_dir else None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._ssl: ssl.SSLContext | None = None

    # -- paths and state ------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (client certificate in group system:masters)."""
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def pod_cidr(self) -> str:
        """Pod IPs on loopback, a /16 of 127.64.0.0/10 chosen by the state dir, so two
        sandboxes (a test's private one, another checkout's) never hand out the same IP."""
        if self.state_dir.resolve() == (REPO / ".sandbox").resolve():
            return POD_CIDR
        digest = hashlib.sha256(str(self.state_dir.resolve()).encode()).digest()
        return f"127.{65 + digest[0] % 63}.0.0/16"

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log (JSON lines; ServiceAccount requests, Metadata level)."""
        return self.logs / "audit.log"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def bin_dir(self) -> Path:
        """Directory of the cached binaries (build.sh's `current` links)."""
        if self._bin_dir is None:
            cache = (
                os.environ.get("MTP_SANDBOX_CACHE") or Path.home() / ".cache/mtp-operator/sandbox"
            )
            self._bin_dir = Path(cache) / "current"
        return self._bin_dir

    def bin(self, name: str) -> Path:
        """Path of a cached binary: etcd, kube-apiserver, kubectl, kwok, helm, ..."""
        return self.bin_dir / name

    def log_file(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, st: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=2))
        tmp.replace(self.state_file)

    @property
    def ports(self) -> dict[str, int]:
        return self.state().get("ports", {})

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd']}"

    def env(self) -> dict[str, str]:
        """Environment for child processes: KUBECONFIG and the cached binaries first on PATH."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "MTP_SANDBOX_APISERVER": self.apiserver_url,
        }

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Serialises up/down between processes (two pytest sessions, a CLI and a session)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / "lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # -- build ----------------------------------------------------------------------------

    def build(self) -> None:
        """Runs build.sh (instant when the binaries are cached; minutes cold)."""
        missing = [c for c in (*COMPONENTS, "kubectl") if not os.access(self.bin(c), os.X_OK)]
        if not missing and (self.bin_dir / "kwok-stages").is_dir():
            return
        _log(f"building sandbox binaries (missing: {', '.join(missing) or 'kwok-stages'})")
        subprocess.run(["bash", str(BUILD_SH)], check=True, stdout=subprocess.DEVNULL)

    # -- HTTP to the apiserver ------------------------------------------------------------

    def _ctx(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
            ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
            self._ssl = ctx
        return self._ssl

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: float = 10,
        content_type: str = "application/json",
    ) -> Any:
        """One request to the apiserver as admin; returns parsed JSON (or text).

        Raises urllib.error.HTTPError on non-2xx."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.apiserver_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        with urllib.request.urlopen(req, context=self._ctx(), timeout=timeout) as r:
            raw = r.read().decode()
        try:
            return json.loads(raw)
        except ValueError:
            return raw

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Runs the cached kubectl against the sandbox; raises with stderr if check fails."""
        cmd = [str(self.bin("kubectl")), "--kubeconfig", str(self.kubeconfig), *args]
        p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise subprocess.CalledProcessError(p.returncode, cmd, p.stdout, p.stderr)
        return p

    # -- components -----------------------------------------------------------------------
