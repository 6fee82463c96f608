"""Host-side helpers of the real node (tests/sandbox/realnode.py): processes, mounts, the
kubelet's client certificate, the pause program."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

PAUSE_C = """#include <signal.h>
#include <unistd.h>
static void quit(int s) { (void)s; _exit(0); }
int main(void) {
  signal(SIGINT, quit); signal(SIGTERM, quit);
  for (;;) pause();
}
"""


class RealNodeError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run(cmd: list[str], timeout: float = 600, check: bool = True,
         **kw: Any) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and out.returncode != 0:
        raise RealNodeError(f"{' '.join(cmd[:4])} ... exited {out.returncode}: "
                            f"{out.stderr.strip()[-3000:]}")
    return out


def pids_with(needle: str, names: tuple[str, ...]) -> list[int]:
    """Live processes whose executable name is in `names` and whose command line has `needle`."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0].decode(errors="replace")) in names and any(
                needle.encode() in a for a in argv):
            found.append(int(d.name))
    return found


def holders_of(path: Path) -> list[str]:
    """'pid command' of every live process with `path` open (a containerd whose database
    another containerd holds waits for it without a word)."""
    target, found = str(path), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) == target for fd in (d / "fd").iterdir()):
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{d.name} {cmd.strip()[:200]}")
        except OSError:
            continue
    return found


def mounts_under(*roots: Path) -> list[str]:
    """Mount points at or below any of `roots`, deepest first."""
    prefixes = [str(r.resolve()) for r in roots]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            points.append(point)
    return sorted(set(points), key=lambda p: -p.count("/"))


def alive(pid: int) -> bool:
    """Running and not a zombie (our own children are reaped here)."""
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"




def node_cert(pki: Path, out: Path, node: str) -> None:
    """A client certificate for the kubelet: system:node:<name> in group system:nodes (what
    the Node authorizer and NodeRestriction expect), signed by the sandbox's CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(hours=1)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                                 x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path = out.with_suffix(".key")
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)


def containerd_toml(root: Path, state: Path, socket_path: Path, pause: str, ip: str) -> str:
    """containerd's own config: root and state apart from the system's, cgroupfs, runc, the
    local pause image, CNI folders under `state`."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root}"
state = "{state / 'containerd-state'}"
[grpc]
  address = "{socket_path}"
[ttrpc]
  address = "{socket_path}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  stream_server_address = "{ip}"
  stream_server_port = "0"
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{state / 'cni-bin'}"
    conf_dir = "{state / 'cni-conf'}"
"""


def kubelet_config(ip: str, ports: dict[str, int], pki: Path, socket_path: Path,
                   pod_logs: Path) -> dict[str, Any]:
    """The KubeletConfiguration that runs on these machines (cgroup v1, no CAP_SYS_RESOURCE)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # these machines have cgroup v1 (hybrid)
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{socket_path}",
        "address": ip,
        "port": ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": ip,
        "healthzPort": ports["kubelet-healthz"],
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(pki / "ca.crt")}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(pod_logs),
        "maxPods": 20,
        "serializeImagePulls": False,
        # a shared machine: never evict our pods for the host's memory or disk use
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "localStorageCapacityIsolation": False,
        "resolvConf": "/etc/resolv.conf",
    }
