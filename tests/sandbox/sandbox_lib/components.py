"""The control-plane processes: their command lines, health checks, start and stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

from sandbox_lib.base import SandboxBase
from sandbox_lib.common import (
    AUDIT_POLICY,
    COMPONENTS,
    NODE_IP,
    SERVICE_CIDR,
    SandboxError,
    _alive,
    _group_members,
    _proc_start_time,
    _tail,
)


class Components(SandboxBase):
    """Starting, checking and stopping the control-plane processes (etcd, apiserver, ...)."""

    def _command(self, name: str, st: dict[str, Any]) -> list[str]:
        p, d, pki = st["ports"], self.state_dir, self.pki
        kcfg = d / "kubeconfigs"
        if name == "etcd":
            peer = f"http://127.0.0.1:{p['etcd-peer']}"
            client = f"http://127.0.0.1:{p['etcd']}"
            return [
                str(self.bin("etcd")),
                "--name=sandbox",
                f"--data-dir={d / 'data/etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=sandbox={peer}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=2147483648",
                "--snapshot-count=50000",
                "--log-level=warn",
            ]
        if name == "kube-apiserver":
            policy = d / "audit-policy.yaml"
            policy.write_text(AUDIT_POLICY)
            return [
                str(self.bin("kube-apiserver")),
                # who did what, for ServiceAccounts only: tests check the operator's RBAC
                # against the requests it really made (tests/cluster/test_chart_rbac.py)
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-maxsize=200",
                "--audit-log-maxbackup=1",
                f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={p['kube-apiserver']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                # the advertised address is loopback, which Endpoints may not hold
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
            ]
        if name == "kube-controller-manager":
            kc = kcfg / "kube-controller-manager.conf"
            return [
                str(self.bin("kube-controller-manager")),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['kube-controller-manager']}",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                "--controllers=*",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--profiling=false",
                "--v=1",
            ]
        if name == "kube-scheduler":
            kc = kcfg / "kube-scheduler.conf"
            return [
                str(self.bin("kube-scheduler")),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['kube-scheduler']}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ]
        if name == "kwok":
            return [
                str(self.bin("kwok")),
                f"--kubeconfig={kcfg / 'kwok.conf'}",
                f"--config={d / 'kwok.yaml'}",
                # every node but the real ones (realnode.py), whose kubelets are real
                "--manage-nodes-with-label-selector=!mtp-operator.io/real-node",
                f"--cidr={self.pod_cidr}",
                f"--node-ip={NODE_IP}",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{p['kwok']}",
                "--v=INFO",
            ]
        raise KeyError(name)

    def _healthy(self, name: str, st: dict[str, Any] | None = None) -> bool:
        st = st or self.state()
        port = st.get("ports", {}).get(name)
        if not port:
            return False
        try:
            if name == "etcd":
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    return json.loads(r.read()).get("health") == "true"
            if name == "kube-apiserver":
                return self.api("GET", "/readyz", timeout=3) == "ok"
            if name == "kwok":
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    return r.status == 200
            ctx = ssl._create_unverified_context()  # self-signed serving certs
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=2
            ) as r:
                return r.read().decode().strip() == "ok"
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def _spawn(self, name: str, st: dict[str, Any]) -> None:
        cmd = self._command(name, st) + self.extra_args.get(name, [])
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.log_file(name), "ab")
        log.write(f"\n==== {time.strftime('%F %T')} {' '.join(cmd)}\n".encode())
        log.flush()
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)}
        env["HOME"] = str(self.state_dir)  # kwok reads ~/.kwok; keep it inside the state dir
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.state_dir,
            env=env,
        )
        log.close()
        self._procs[name] = proc
        st.setdefault("pids", {})[name] = {"pid": proc.pid, "start": _proc_start_time(proc.pid)}
        self._save(st)

    def _wait_healthy(self, name: str, st: dict[str, Any], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pid = st["pids"][name]
        while time.monotonic() < deadline:
            if not _alive(pid["pid"], pid["start"]):
                raise SandboxError(
                    f"{name} exited during start-up; log {self.log_file(name)}:\n"
                    + _tail(self.log_file(name))
                )
            if self._healthy(name, st):
                return
            time.sleep(0.1)
        raise SandboxError(
            f"{name} not healthy after {timeout:.0f} s; log {self.log_file(name)}:\n"
            + _tail(self.log_file(name))
        )

    def _stop_pid(self, name: str, info: dict[str, Any], sig: int, timeout: float) -> None:
        pid, start = info["pid"], info.get("start")
        if _alive(pid, start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + timeout
        proc = self._procs.pop(name, None)
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()  # reap our own child so it does not linger as a zombie
            if not _alive(pid, start) and not _group_members(pid):
                return
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()
            if not _alive(pid, start) and not _group_members(pid):
                return
            time.sleep(0.05)
        raise SandboxError(f"{name} (pid {pid}) survived SIGKILL")

    def stop_component(self, name: str, *, sig: int = signal.SIGTERM, timeout: float = 5) -> None:
        """Stops one component (its whole process group); ports, certs and data stay.

        Sends `sig` (SIGKILL simulates a crash), then SIGKILL after `timeout` seconds: with
        clients watching, kube-apiserver stops listening at once but lingers in shutdown for
        up to a minute. Other components keep running and retry until start_component()."""
        st = self.state()
        info = st.get("pids", {}).pop(name, None)
        if info:
            self._stop_pid(name, info, sig, timeout)
        self._save(st)

    def start_component(self, name: str, *, timeout: float = 60) -> None:
        """(Re)starts one stopped component on the same ports with the same certs and data."""
        if name not in COMPONENTS:
            raise KeyError(f"unknown component {name!r}; one of {COMPONENTS}")
        st = self.state()
        if not st:
            raise SandboxError("sandbox is not set up; call up() first")
        info = st.get("pids", {}).get(name)
        if info and _alive(info["pid"], info.get("start")):
            raise SandboxError(f"{name} is already running (pid {info['pid']})")
        self._spawn(name, st)
        self._wait_healthy(name, st, timeout)
        if name == "kube-apiserver":
            self._ssl = None

    def components(self) -> dict[str, dict[str, Any]]:
        """Per component: pid, port, running (process alive), healthy (health endpoint)."""
        st = self.state()
        out = {}
        for c in COMPONENTS:
            info = st.get("pids", {}).get(c) or {}
            running = _alive(info.get("pid"), info.get("start"))
            out[c] = {
                "pid": info.get("pid"),
                "port": st.get("ports", {}).get(c),
                "running": running,
                "healthy": running and self._healthy(c, st),
            }
        return out
