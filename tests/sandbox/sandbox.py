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
import datetime as _dt
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
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
#: kwok gives pods IPs from this range; it is loopback, so a test can serve a fake pod's
#: /metrics on the pod's IP (Linux routes all of 127.0.0.0/8 to lo).
POD_CIDR = "127.64.0.0/16"
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


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
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


def _pki(pki: Path) -> None:
    """CA, serving cert for the apiserver, client certs and the service-account key pair.

    ECDSA P-256 throughout: key generation is instant, and every component accepts it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    pki.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(hours=1)
    until = now + _dt.timedelta(days=365)

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    def write(name: str, data: bytes, mode: int = 0o644) -> None:
        p = pki / name
        p.write_bytes(data)
        p.chmod(mode)

    def name(cn: str, orgs: Sequence[str] = ()) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("mtp-sandbox-ca")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    write("ca.crt", ca.public_bytes(serialization.Encoding.PEM))
    write("ca.key", key_pem(ca_key), 0o600)

    def leaf(
        fname: str,
        cn: str,
        orgs: Sequence[str] = (),
        *,
        server: bool = False,
        sans: Sequence[str] = (),
        ips: Sequence[str] = (),
    ) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        b = (
            x509.CertificateBuilder()
            .subject_name(name(cn, orgs))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if sans or ips:
            alt: list[x509.GeneralName] = [x509.DNSName(s) for s in sans]
            alt += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        write(f"{fname}.crt", cert.public_bytes(serialization.Encoding.PEM))
        write(f"{fname}.key", key_pem(key), 0o600)

    svc_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
    leaf(
        "apiserver",
        "kube-apiserver",
        server=True,
        sans=[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        ips=["127.0.0.1", svc_ip],
    )
    leaf("admin", "kubernetes-admin", ["system:masters"])
    # The controller manager and scheduler keep their usual user names but are also in
    # system:masters, which the apiserver authorizes without RBAC: right after an apiserver
    # restart the RBAC cache is still empty, and the "forbidden" answers it gives then push
    # client-go's list/watch backoff up to a minute, which made outage drills slow.
    leaf("kube-controller-manager", "system:kube-controller-manager", ["system:masters"])
    leaf("kube-scheduler", "system:kube-scheduler", ["system:masters"])
    # kwok plays every kubelet (node status, leases, pod status, pod deletion)
    leaf("kwok", "kwok-controller", ["system:masters"])
    leaf("apiserver-etcd-client", "kube-apiserver-etcd-client")

    sa_key = ec.generate_private_key(ec.SECP256R1())
    write("sa.key", key_pem(sa_key), 0o600)
    write(
        "sa.pub",
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )


def _kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "mtp-sandbox",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{user}.crt"),
                    "client-key": str(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "mtp-sandbox", "context": {"cluster": "mtp-sandbox", "user": user}}],
        "current-context": "mtp-sandbox",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    path.chmod(0o600)


# ---------------------------------------------------------------------------------- nodes


def node_objects(nodes_file: Path = NODES_YAML) -> list[dict[str, Any]]:
    """The Node objects described by nodes.yaml (see the comments in that file)."""
    spec = yaml.safe_load(nodes_file.read_text())
    defaults = spec.get("defaults", {})
    nodes = []
    for pool in spec["pools"]:
        for i in range(int(pool.get("count", 1))):
            name = f"{pool['prefix']}-{i}"
            labels = {**defaults.get("labels", {}), **pool.get("labels", {})}
            labels["kubernetes.io/hostname"] = name
            resources = {
                "cpu": str(pool.get("cpu", defaults.get("cpu", "64"))),
                "memory": str(pool.get("memory", defaults.get("memory", "512Gi"))),
                "pods": str(pool.get("pods", defaults.get("pods", "110"))),
            }
            if pool.get("product"):
                gpus = str(pool.get("gpus", 8))
                labels.update(
                    {
                        "nvidia.com/gpu.present": "true",
                        "nvidia.com/gpu.product": pool["product"],
                        "nvidia.com/gpu.count": gpus,
                        "nvidia.com/gpu.memory": str(pool["memoryMiB"]),
                        "nvidia.com/gpu.family": pool["family"],
                    }
                )
                if "compute" in pool:
                    major, minor = str(pool["compute"]).split(".")
                    labels["nvidia.com/gpu.compute.major"] = major
                    labels["nvidia.com/gpu.compute.minor"] = minor
                resources["nvidia.com/gpu"] = gpus
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {
                        **defaults.get("annotations", {}),
                        **pool.get("annotations", {}),
                    },
                },
                "spec": {"taints": pool["taints"]} if pool.get("taints") else {},
                "status": {"capacity": resources, "allocatable": dict(resources)},
            }
            nodes.append(node)
    return nodes


# ---------------------------------------------------------------------------------- sandbox


class Sandbox:
    """One local control plane, its state in `state_dir` (default <repo>/.sandbox).

    Processes are started in their own sessions (process groups), detached from the caller,
    so a CLI `up` can exit and leave them running; `down` (from any process) stops them by
    the pids and start times recorded in state.json.
    """

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
                # every node but the real one (realnode.py), whose kubelet is real
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
