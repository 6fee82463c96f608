"""Sandbox constants (versions, CIDRs, kwok stages, audit policy) and process helpers."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # tests/sandbox
REPO = HERE.parent.parent
BUILD_SH = HERE / "build.sh"
NODES_YAML = HERE / "nodes.yaml"
KUBE_VERSION = os.environ.get("KUBE_VERSION", "v1.36.3")

#: start order; stop order is the reverse
COMPONENTS: tuple[str, ...] = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
)
SERVICE_CIDR = "10.96.0.0/16"
#: kwok gives pods IPs from a /16 of this range (Sandbox.pod_cidr, chosen by the state dir);
#: it is loopback, so a test can serve a fake pod's /metrics on the pod's IP (Linux routes
#: all of 127.0.0.0/8 to lo).
POD_RANGE = "127.64.0.0/10"
NODE_IP = "127.0.0.1"
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"""


class SandboxError(RuntimeError):
    """A sandbox operation failed; the message names the component and shows its log tail."""


def _log(msg: str) -> None:
    print(f"[sandbox {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on host:port now (SO_REUSEADDR, as servers bind: a
    port whose earlier connections sit in TIME_WAIT counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


# ---------------------------------------------------------------------------------- processes


def _proc_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie process; None otherwise."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _alive(pid: int | None, start_time: int | None = None) -> bool:
    if not pid:
        return False
    st = _proc_start_time(pid)
    return st is not None and (start_time is None or st == start_time)


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            out.append(int(d.name))
    return out


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_bytes()[-20000:].decode(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(data.splitlines()[-lines:])


# ---------------------------------------------------------------------------------- PKI
