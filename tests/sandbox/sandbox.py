#!/usr/bin/env python3
"""Local sandbox: a real Kubernetes control plane on loopback with simulated GPU nodes.

Real: etcd, kube-apiserver, kube-controller-manager, kube-scheduler (v1.36.3, built from Go
modules by build.sh). Simulated: the nodes and the pods' lifecycle (kwok plays the kubelet's
part: Ready nodes with leases, pods scheduled onto them become Running/Ready, deleted pods go
away). Nothing runs in containers.

CLI::

    python tests/sandbox/sandbox.py up       # last line: KUBECONFIG=<abs path>
    python tests/sandbox/sandbox.py down     # stops everything it started
    python tests/sandbox/sandbox.py status
    python tests/sandbox/sandbox.py env      # shell exports: eval "$(... env)"

Python::

    sb = Sandbox()            # state in <repo>/.sandbox (or $MTP_SANDBOX_DIR)
    sb.up()                   # idempotent; returns the kubeconfig path
    sb.kubectl("get", "nodes")
    sb.stop_component("kube-apiserver"); sb.start_component("kube-apiserver")
    sb.down()

State dir layout: state.json (ports, pids, command lines), kubeconfig (admin, system:masters),
pki/, kubeconfigs/ (per component), logs/<component>.log, data/etcd, lock.
Only the standard library plus PyYAML and cryptography are used.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sandbox_lib.common import (
    COMPONENTS,
    KUBE_VERSION,
    KWOK_STAGES,
    NODES_YAML,
    SandboxError,
    _alive,
    _log,
    _proc_start_time,
    _tail,
    free_port,
)
from sandbox_lib.components import Components
from sandbox_lib.nodes import node_objects
from sandbox_lib.pki import _kubeconfig, _pki

# what tests, bench and scripts import from here
__all__ = ["NODES_YAML", "Sandbox", "SandboxError", "free_port", "main", "node_objects"]


class Sandbox(Components):
    """One local control plane, its state in `state_dir` (default <repo>/.sandbox).

    Processes are started in their own sessions (process groups), detached from the caller,
    so a CLI `up` can exit and leave them running; `down` (from any process) stops them by
    the pids and start times recorded in state.json.
    """

    def is_running(self) -> bool:
        """All components alive and healthy."""
        if not self.state_file.exists():
            return False
        return all(c["healthy"] for c in self.components().values())

    # -- up / down ------------------------------------------------------------------------

    def up(self, *, timeout: float = 120, started_by: str = "api") -> Path:
        """Starts the sandbox (or finds it running) and returns the admin kubeconfig path.

        A half-running sandbox is torn down and started afresh. On failure, everything this
        call started is stopped and SandboxError names the component with its log tail."""
        with self.lock():
            if self.is_running():
                st = self.state()
                if started_by == "cli" and st.get("started_by") != "cli":
                    st["started_by"] = "cli"  # someone asked for it explicitly: keep it
                    self._save(st)
                return self.kubeconfig
            if self.state_file.exists():
                _log("found a stale or partial sandbox; stopping it first")
                self._down_locked()
            t0 = time.monotonic()
            self.build()
            for attempt in (1, 2):
                try:
                    self._up_locked(timeout, started_by)
                    break
                except BaseException as e:
                    with contextlib.suppress(Exception):
                        self._down_locked(quiet=True)
                    # a free port picked for one component can be taken before it binds
                    if attempt == 2 or "address already in use" not in str(e):
                        raise
                    _log("a port was taken meanwhile; starting again on fresh ports")
            _log(f"sandbox up in {time.monotonic() - t0:.1f} s ({self.apiserver_url})")
            return self.kubeconfig

    def _up_locked(self, timeout: float, started_by: str) -> None:
        d = self.state_dir
        for sub in ("pki", "kubeconfigs", "data", "logs"):
            shutil.rmtree(d / sub, ignore_errors=True)
        (d / "data").mkdir(parents=True)
        self.logs.mkdir(parents=True)
        self._ssl = None
        ports: dict[str, int] = {}
        for name in ("etcd", "etcd-peer", *COMPONENTS[1:]):
            while True:
                port = free_port()
                if port not in ports.values():
                    break
            ports[name] = port
        st: dict[str, Any] = {
            "ports": ports,
            "pids": {},
            "started_by": started_by,
            "created": time.strftime("%FT%T%z"),
            "kube_version": KUBE_VERSION,
        }
        self._save(st)
        _pki(self.pki)
        server = f"https://127.0.0.1:{ports['kube-apiserver']}"
        _kubeconfig(self.kubeconfig, server, self.pki, "admin")
        for comp, user in (
            ("kube-controller-manager", "kube-controller-manager"),
            ("kube-scheduler", "kube-scheduler"),
            ("kwok", "kwok"),
        ):
            _kubeconfig(d / "kubeconfigs" / f"{comp}.conf", server, self.pki, user)
        stages = self.bin_dir / "kwok-stages"
        docs = [(stages / s).read_text().strip() for s in KWOK_STAGES]
        (d / "kwok.yaml").write_text("\n---\n".join(docs) + "\n")

        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        self._spawn("etcd", st)
        self._wait_healthy("etcd", st, left())
        self._spawn("kube-apiserver", st)
        self._wait_healthy("kube-apiserver", st, left())
        for c in COMPONENTS[2:]:
            self._spawn(c, st)
        self._create_nodes()
        for c in COMPONENTS[2:]:
            self._wait_healthy(c, st, left())
        self._wait_nodes_ready(left())
        self._wait_default_sa(left())

    def _create_nodes(self) -> None:
        for node in node_objects(self.nodes_file):
            try:
                self.api("POST", "/api/v1/nodes", node)
            except urllib.error.HTTPError as e:
                if e.code != 409:
                    raise SandboxError(
                        f"creating node {node['metadata']['name']}: {e.code} {e.read()!r}"
                    ) from e
            # the apiserver keeps status on create, but make sure capacity is what we asked
            got = self.api("GET", f"/api/v1/nodes/{node['metadata']['name']}")
            if got.get("status", {}).get("capacity", {}).get("nvidia.com/gpu") != node["status"][
                "capacity"
            ].get("nvidia.com/gpu"):
                self.api(
                    "PATCH",
                    f"/api/v1/nodes/{node['metadata']['name']}/status",
                    {"status": node["status"]},
                    content_type="application/strategic-merge-patch+json",
                )

    def nodes_ready(self) -> tuple[bool, list[str]]:
        """(all expected nodes Ready and untainted by not-ready, names of those that are not)."""
        want = {n["metadata"]["name"] for n in node_objects(self.nodes_file)}
        items = {n["metadata"]["name"]: n for n in self.api("GET", "/api/v1/nodes")["items"]}
        bad = []
        for name in sorted(want):
            n = items.get(name)
            ready = n and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
            tainted = n and any(
                t["key"].startswith("node.kubernetes.io/") for t in n["spec"].get("taints", [])
            )
            if not ready or tainted:
                bad.append(name)
        return not bad, bad

    def _wait_nodes_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        bad: list[str] = []
        while time.monotonic() < deadline:
            ok, bad = self.nodes_ready()
            if ok:
                return
            self._check_alive()
            time.sleep(0.2)
        raise SandboxError(
            f"nodes not Ready after {timeout:.0f} s: {bad}; kwok log:\n"
            + _tail(self.log_file("kwok"))
            + "\nkube-controller-manager log:\n"
            + _tail(self.log_file("kube-controller-manager"), 20)
        )

    def _wait_default_sa(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.api("GET", "/api/v1/namespaces/default/serviceaccounts/default")
                return
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    raise
            self._check_alive()
            time.sleep(0.1)
        raise SandboxError(
            "ServiceAccount default/default not created; kube-controller-manager log:\n"
            + _tail(self.log_file("kube-controller-manager"))
        )

    def _check_alive(self) -> None:
        for c, info in self.state().get("pids", {}).items():
            if not _alive(info["pid"], info.get("start")):
                raise SandboxError(
                    f"{c} exited; log {self.log_file(c)}:\n" + _tail(self.log_file(c))
                )

    def down(self) -> None:
        """Stops every component (process groups, SIGTERM then SIGKILL), verifies that none
        survives, and removes the runtime state (logs are kept in <state>/logs.last)."""
        with self.lock():
            self._down_locked()

    def _down_locked(self, quiet: bool = False) -> None:
        st = self.state()
        errors = []
        if (self.state_dir / "realnode").exists():  # their pods go while the apiserver runs
            import realnode

            try:
                realnode.stop_all(self, quiet=quiet)
            except Exception as e:
                errors.append(f"real node: {e}")
        for c in reversed(COMPONENTS):
            info = st.get("pids", {}).get(c)
            if info:
                try:
                    self._stop_pid(c, info, signal.SIGTERM, 10)
                except SandboxError as e:
                    errors.append(str(e))
        # belt and braces: anything still running one of our binaries with our state dir
        for pid in self.leftover_processes():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if errors:
            raise SandboxError("; ".join(errors))
        # our pids are gone; give whoever reaps them (us or init) a moment, so that `ps` right
        # after `down` shows no <defunct> entries either
        deadline = time.monotonic() + 2
        pids = [i["pid"] for i in st.get("pids", {}).values()]
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.05)
        d = self.state_dir
        if self.logs.exists():
            shutil.rmtree(d / "logs.last", ignore_errors=True)
            self.logs.rename(d / "logs.last")
        for p in d.iterdir() if d.exists() else ():
            if p.name in ("lock", "logs.last", "users"):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        self._ssl = None
        if not quiet:
            _log("sandbox down")

    def leftover_processes(self) -> list[int]:
        """Pids of live processes whose command line mentions this state dir."""
        needle = str(self.state_dir).encode()
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                cmdline = (d / "cmdline").read_bytes()
            except OSError:
                continue
            exe = cmdline.split(b"\0", 1)[0]
            if needle in cmdline and os.path.basename(exe).decode(errors="replace") in COMPONENTS:
                if _alive(int(d.name)):
                    out.append(int(d.name))
        return out

    # -- users (pytest sessions sharing one sandbox) --------------------------------------

    def acquire(self, started_by: str = "pytest", timeout: float = 120) -> Path:
        """up() and register this process as a user; pair with release()."""
        path = self.up(timeout=timeout, started_by=started_by)
        self.add_user()
        return path

    def release(self, keep: bool = False) -> bool:
        """Unregisters this process; stops the sandbox when a pytest session started it, no
        other live process uses it and `keep` is false. Returns True if it was stopped."""
        self.remove_user()
        if keep:
            return False
        with self.lock():
            if self.state().get("started_by") == "pytest" and not self.live_users():
                self._down_locked()
                return True
        return False

    def add_user(self, pid: int | None = None) -> None:
        users = self.state_dir / "users"
        users.mkdir(parents=True, exist_ok=True)
        pid = pid or os.getpid()
        (users / str(pid)).write_text(str(_proc_start_time(pid)))

    def remove_user(self, pid: int | None = None) -> None:
        (self.state_dir / "users" / str(pid or os.getpid())).unlink(missing_ok=True)

    def live_users(self) -> list[int]:
        users = self.state_dir / "users"
        out = []
        for f in users.iterdir() if users.exists() else ():
            try:
                start = int(f.read_text())
            except (OSError, ValueError):
                start = None
            if f.name.isdigit() and _alive(int(f.name), start):
                out.append(int(f.name))
            else:
                f.unlink(missing_ok=True)
        return out

    # -- status ---------------------------------------------------------------------------

    def version(self) -> dict[str, Any]:
        return self.api("GET", "/version")

    def status_text(self) -> str:
        if not self.state_file.exists():
            return f"sandbox: not running (state dir {self.state_dir})"
        lines = [f"sandbox: state dir {self.state_dir}"]
        comps = self.components()
        for c, info in comps.items():
            state = "healthy" if info["healthy"] else ("running" if info["running"] else "DOWN")
            lines.append(f"  {c:<24} {state:<8} pid={info['pid']} port={info['port']}")
        if comps["kube-apiserver"]["healthy"]:
            lines.append(f"  apiserver {self.apiserver_url} version {self.version()['gitVersion']}")
            lines.append(f"  kubeconfig {self.kubeconfig}")
            lines.append("  nodes:")
            for n in self.api("GET", "/api/v1/nodes")["items"]:
                labels = n["metadata"].get("labels", {})
                ready = next(
                    (
                        c["status"]
                        for c in n["status"].get("conditions", [])
                        if c["type"] == "Ready"
                    ),
                    "?",
                )
                gpus = n["status"].get("capacity", {}).get("nvidia.com/gpu", "0")
                product = labels.get("nvidia.com/gpu.product", "-")
                lines.append(
                    f"    {n['metadata']['name']:<12} Ready={ready:<6} gpu={gpus:<2} {product}"
                )
        return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["up", "down", "status", "env", "build"])
    ap.add_argument("--state-dir", help="default: <repo>/.sandbox or $MTP_SANDBOX_DIR")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--started-by", default="cli", choices=("cli", "api"),
                    help="up: `cli` keeps the sandbox running for good; `api` leaves a running "
                    "sandbox to whoever started it (a test session stops it at its end)")
    args = ap.parse_args(argv)
    sb = Sandbox(args.state_dir)
    try:
        if args.command == "up":
            was = sb.is_running()
            path = sb.up(timeout=args.timeout, started_by=args.started_by)
            if was:
                _log(f"sandbox already running ({sb.apiserver_url})")
            print(f"KUBECONFIG={path}", flush=True)
        elif args.command == "down":
            sb.down()
            left = sb.leftover_processes()
            if left:
                print(f"processes left: {left}", file=sys.stderr)
                return 1
        elif args.command == "status":
            print(sb.status_text())
            return 0 if sb.is_running() else 3
        elif args.command == "env":
            if not sb.state_file.exists():
                print("sandbox not running", file=sys.stderr)
                return 3
            print(f"export KUBECONFIG={sb.kubeconfig}")
            print(f"export MTP_SANDBOX_APISERVER={sb.apiserver_url}")
            print(f'export PATH="{sb.bin_dir}:$PATH"')
        elif args.command == "build":
            sb.build()
    except SandboxError as e:
        print(f"sandbox: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"sandbox: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
