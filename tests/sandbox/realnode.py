"""One real node beside the sandbox's kwok nodes: kubelet (built by build.sh) with containerd
and runc from Debian, for tests that must run real containers (the chart's operator pod, a
runtime pod with real vLLM).

    node = RealNode(sandbox)           # state in <sandbox state>/realnode/mtp-real-0
    node.start()                       # registers node `mtp-real-0`, Ready; idempotent
    node.load_image("localhost/x:tag") # podman's image -> containerd (kept across runs)
    node.stop()                        # pods, kubelet, containerd, shims, mounts: all gone
    RealNode(sandbox, 1)               # a second one, `mtp-real-1` on 127.0.0.2
    stop_all(sandbox)                  # every real node of this sandbox (sandbox down does it)

Node i has the IP 127.0.0.(i+1): hostNetwork pods share the host's network namespace, so two
pods on two real nodes can listen on the same port only on their own node's IP. Other pods
get a network namespace of their own from containerd through the CNI plugins build.sh makes:
a veth on the node's bridge `mtpcni<i>`, an address of 10.236.<i>.0/24, reachable from this
host (and from the other nodes' pods: one host routes them all) but from nowhere else.

The node carries the label `mtp-operator.io/real-node=true` and the taint
`mtp-operator.io/real-node=true:NoSchedule`, so only pods that tolerate it land there; kwok
leaves it alone (the sandbox's kwok manages nodes without that label). Pause image: a static
`pause()` program built with gcc and imported (no registry is reachable).

containerd's root (its content store and snapshots) is kept in
~/.cache/mtp-operator/realnode/shared/<node name>/ so a large image is imported once, not on
every run, and once per machine, not once per checkout (the CPU runtime image takes ~13 GB
there: its layers plus their unpacked snapshots; a cache per checkout filled a CI machine's
disk). The node's containerd holds an flock on `<node name>.lock` for as long as it lives
(the locked file is handed to it), so two sandboxes never share a root: the second one gets a
root of its own under its state dir, removed by stop(). Importing an image removes the
images of the same repository with other tags (containerd then collects their layers), so
the cache holds one version of each image. containerd's state (sockets, running tasks) and
kubelet's root are under the state dir and removed by stop(). Needs root (kubelet and
containerd do).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
from pathlib import Path
from typing import Any

import yaml

from sandbox_lib.realnode_host import (
    PAUSE_C,
    RealNodeError,
    alive,
    containerd_toml,
    free_port,
    holders_of,
    kubelet_config,
    mounts_under,
    node_cert,
    pids_with,
    run,
)

NODE_PREFIX = "mtp-real-"
LABEL = "mtp-operator.io/real-node"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
NAMESPACE = "k8s.io"  # containerd namespace the CRI plugin uses
CONTAINERD_START_SECONDS = 60.0
CACHE = Path(os.environ.get("MTP_REALNODE_CACHE", Path.home() / ".cache/mtp-operator/realnode"))




def stop_all(sandbox: Any, quiet: bool = False) -> None:
    """Stops every real node this sandbox started (their folders under <state>/realnode)."""
    base = Path(sandbox.state_dir) / "realnode"
    errors = []
    for d in sorted(base.glob(f"{NODE_PREFIX}*")) if base.exists() else ():
        try:
            RealNode(sandbox, int(d.name[len(NODE_PREFIX):])).stop(quiet=quiet)
        except (RealNodeError, ValueError, OSError) as e:
            errors.append(f"{d.name}: {e}")
    if errors:
        raise RealNodeError("; ".join(errors))
    if base.exists() and not any(base.iterdir()):
        base.rmdir()


class RealNode:
    def __init__(self, sandbox: Any, index: int = 0) -> None:
        self.sb = sandbox
        self.index = index
        self.name = f"{NODE_PREFIX}{index}"
        self.ip = f"127.0.0.{index + 1}"
        self.dir = Path(sandbox.state_dir) / "realnode" / self.name
        self.shared_root = CACHE / "shared" / self.name / "containerd-root"
        self.own_root = self.dir / "containerd-root"  # when another sandbox holds the shared one
        self.socket = self.dir / "containerd.sock"
        self.kubelet_root = self.dir / "kubelet"
        self.pod_logs = self.dir / "pod-logs"
        self.state_file = self.dir / "state.json"

    # -- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, st: dict[str, Any]) -> None:
        self.state_file.write_text(json.dumps(st, indent=2))

    @property
    def root(self) -> Path:
        """The containerd root this node runs (or last ran) on."""
        return Path(self.state().get("root") or self.shared_root)

    def _take_root(self) -> tuple[Path, int | None]:
        """The shared root with its lock taken (the open, locked file, for containerd to
        inherit), or this node's own root when another live containerd holds the lock."""
        lock = self.shared_root.parent.with_suffix(".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            print(f"[realnode] {self.name}: the shared containerd cache is in use by another "
                  f"sandbox; using {self.own_root} (removed on stop)", flush=True)
            return self.own_root, None
        return self.shared_root, fd

    def is_running(self) -> bool:
        pids = self.state().get("pids", {})
        return bool(pids) and all(Path(f"/proc/{p}").exists() for p in pids.values())

    def log_file(self, component: str) -> Path:
        return self.dir / f"{component}.log"

    def ctr(self, *args: str, timeout: float = 600,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(["ctr", "--address", str(self.socket), "-n", NAMESPACE, *args],
                    timeout=timeout, check=check)

    # -- start ----------------------------------------------------------------------------

    def start(self, timeout: float = 90) -> RealNode:
        if self.is_running() and self._node_ready():
            return self
        if os.geteuid() != 0:
            raise RealNodeError("the real node needs root (kubelet, containerd)")
        for tool in ("containerd", "ctr", "runc", "gcc", "podman"):
            if run(["sh", "-c", f"command -v {tool}"], check=False).returncode:
                raise RealNodeError(f"{tool} not found: run tests/images/install_tools.sh")
        kubelet = self.sb.bin("kubelet")
        if not Path(kubelet).exists():
            raise RealNodeError(f"{kubelet} missing: run tests/sandbox/build.sh")
        self.stop(quiet=True)  # leftovers of a crashed run
        root, lock_fd = self._take_root()
        for d in (self.dir, root, self.kubelet_root, self.pod_logs):
            d.mkdir(parents=True, exist_ok=True)
        st: dict[str, Any] = {"pids": {}, "root": str(root), "ports": {
            "kubelet": free_port(self.ip), "kubelet-healthz": free_port(self.ip)}}
        self._pod_network_files()
        self._save(st)
        try:  # the lock lives as long as containerd: it inherits the locked file
            st["pids"]["containerd"] = self._spawn(
                "containerd", self._containerd_cmd(), () if lock_fd is None else (lock_fd,))
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._save(st)
        if not self._containerd_serving(CONTAINERD_START_SECONDS) and root != self.own_root:
            # Seen once in CI on the shared cache: containerd logged its plugin warnings and
            # then served nothing for minutes (a later start on the same root took 2 s). Say
            # who holds its database and go on with a root of this node's own.
            db = root / "io.containerd.metadata.v1.bolt" / "meta.db"
            print(f"[realnode] {self.name}: containerd on {root} did not serve within "
                  f"{CONTAINERD_START_SECONDS:.0f} s; processes with {db} open: "
                  f"{holders_of(db) or 'none'}; starting again on {self.own_root} "
                  "(removed on stop)", flush=True)
            self._kill(st["pids"]["containerd"], "containerd")
            st["root"] = str(self.own_root)
            self.own_root.mkdir(parents=True, exist_ok=True)
            self._save(st)
            st["pids"]["containerd"] = self._spawn("containerd", self._containerd_cmd())
            self._save(st)
        self._wait(lambda: self._containerd_serving(0), CONTAINERD_START_SECONDS,
                   "containerd", "containerd")
        self._load_pause()
        self._kubelet_files(st)
        st["pids"]["kubelet"] = self._spawn("kubelet", self._kubelet_cmd(st))
        self._save(st)
        self._wait(lambda: self.node() is not None, timeout, f"node {self.name} registered",
                   "kubelet")
        self._set_address()
        self._wait(self._node_ready, timeout, f"node {self.name} Ready", "kubelet")
        return self

    def _containerd_serving(self, timeout: float) -> bool:
        """Whether `ctr version` answers within `timeout` s (one try with 0); a try that
        hangs (containerd not serving yet) counts as not yet."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.ctr("version", check=False, timeout=10).returncode == 0:
                    return True
            except subprocess.TimeoutExpired:
                pass
            pid = self.state().get("pids", {}).get("containerd")
            if time.monotonic() >= deadline or (pid and not alive(pid)):
                return False
            time.sleep(0.5)

    def _set_address(self) -> None:
        """kubelet refuses a loopback --node-ip ("nodeIP can't be loopback address") and then
        leaves status.addresses empty, so hostNetwork pods would get no pod IP (and no probes).
        The address is written through the API instead; kubelet keeps what it cannot set."""
        self.sb.api("PATCH", f"/api/v1/nodes/{self.name}/status", {"status": {"addresses": [
            {"type": "InternalIP", "address": self.ip},
            {"type": "Hostname", "address": self.name}]}},
            content_type="application/strategic-merge-patch+json")

    def _spawn(self, name: str, cmd: list[str], pass_fds: tuple[int, ...] = ()) -> int:
        log = open(self.log_file(name), "ab")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                pass_fds=pass_fds)
        log.close()
        return proc.pid

    def _wait(self, ok: Any, timeout: float, what: str, component: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            pid = self.state().get("pids", {}).get(component)
            if pid and not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.5)
        tail = "\n".join(self.log_file(component).read_text(errors="replace")
                         .splitlines()[-30:]) if self.log_file(component).exists() else ""
        raise RealNodeError(f"{what} not within {timeout:.0f} s; {component} log:\n{tail}")

    @property
    def bridge(self) -> str:
        """The node's pod bridge (the pods' gateway, this host's route to their subnet)."""
        return f"mtpcni{self.index}"

    @property
    def pod_subnet(self) -> str:
        return f"10.236.{self.index}.0/24"

    def pod_gateway(self) -> str:
        """This host's address on the pod bridge (the pods' gateway, 10.236.<i>.1): where a pod
        off hostNetwork reaches a server a test runs on this host. Makes the bridge with that
        address when no pod has made it yet (the CNI bridge plugin takes a bridge that holds
        exactly its gateway address as its own); the node's stop removes it."""
        gateway = self.pod_subnet.rsplit(".", 1)[0] + ".1"
        if subprocess.run(["ip", "link", "show", self.bridge], capture_output=True).returncode:
            subprocess.run(["ip", "link", "add", "name", self.bridge, "type", "bridge"],
                           check=True, capture_output=True)
        have = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", self.bridge],
                              capture_output=True, text=True, check=True).stdout
        if f"inet {gateway}/24" not in have:
            subprocess.run(["ip", "addr", "add", f"{gateway}/24", "dev", self.bridge],
                           check=True, capture_output=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True, capture_output=True)
        return gateway

    def _pod_network_files(self) -> None:
        """The pod network: build.sh's CNI plugins and a bridge conflist. Each pod off
        hostNetwork gets a network namespace of its own, a veth on the node's bridge and an
        address of `pod_subnet` (host-local); this host reaches it through the bridge, as
        kubelet's probes and the tests' clients do. hostNetwork pods never call it."""
        plugins = Path(self.sb.bin("cni"))
        if not all((plugins / p).exists() for p in ("bridge", "host-local", "loopback")):
            raise RealNodeError(f"CNI plugins missing in {plugins}: run tests/sandbox/build.sh")
        bins = self.dir / "cni-bin"
        bins.mkdir(exist_ok=True)
        for p in ("bridge", "host-local", "loopback"):
            (bins / p).unlink(missing_ok=True)
            (bins / p).symlink_to(plugins / p)
        conf = self.dir / "cni-conf"
        conf.mkdir(exist_ok=True)
        for old in conf.glob("*.conflist"):
            old.unlink()
        (conf / "10-mtp-pods.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": f"mtp-pods-{self.index}",
            "plugins": [{"type": "bridge", "bridge": self.bridge, "isGateway": True,
                         "ipMasq": False, "hairpinMode": True,
                         "ipam": {"type": "host-local", "dataDir": str(self.dir / "cni-ipam"),
                                  "ranges": [[{"subnet": self.pod_subnet}]],
                                  "routes": [{"dst": "0.0.0.0/0"}]}}]}))

    def _pod_namespaces(self) -> list[str]:
        """The network namespaces (under /var/run/netns) holding an address of this node's
        pod subnet: pods whose sandbox containerd did not tear down."""
        prefix = self.pod_subnet.rsplit(".", 1)[0] + "."
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        found = []
        for line in out.stdout.splitlines():
            ns = line.split()[0] if line.split() else ""
            addrs = subprocess.run(["ip", "-n", ns, "-4", "-o", "addr"], capture_output=True,
                                   text=True).stdout
            if f"inet {prefix}" in addrs:
                found.append(ns)
        return found

    def _clean_pod_network(self) -> None:
        for ns in self._pod_namespaces():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def _containerd_cmd(self) -> list[str]:
        pause = self.pause_image()
        config = containerd_toml(self.root, self.dir, self.socket, pause, self.ip)
        path = self.dir / "containerd.toml"
        path.write_text(config)
        return ["containerd", "--config", str(path), "--log-level", "warn"]

    # -- images ---------------------------------------------------------------------------

    def pause_image(self) -> str:
        key = hashlib.sha256(PAUSE_C.encode()).hexdigest()[:12]
        return f"localhost/mtp-pause:{key}"

    def _load_pause(self) -> None:
        ref = self.pause_image()
        if self._has_image(ref):
            return
        build = CACHE / "pause" / ref.rsplit(":", 1)[1]
        binary = build / "rootfs" / "pause"
        if not binary.exists():
            (build / "rootfs").mkdir(parents=True, exist_ok=True)
            (build / "pause.c").write_text(PAUSE_C)
            run(["gcc", "-static", "-Os", "-s", "-o", str(binary), str(build / "pause.c")])
        if run(["podman", "image", "exists", ref], check=False).returncode:
            tar = subprocess.Popen(["tar", "-C", str(build / "rootfs"), "-c", "."],
                                   stdout=subprocess.PIPE)
            run(["podman", "import", "--change", 'ENTRYPOINT=["/pause"]', "-", ref],
                 stdin=tar.stdout)
            tar.wait()
        self.load_image(ref)

    def _has_image(self, ref: str) -> bool:
        out = self.ctr("images", "ls", "-q", check=False, timeout=30)
        return ref in out.stdout.split()

    def load_image(self, ref: str) -> None:
        """Hands podman's image `ref` to containerd (podman save | ctr import), unless
        containerd has it already (refs carry a key over their inputs, so same ref = same
        image)."""
        if self._has_image(ref):
            return
        # streamed: an archive on disk would take the image's size again (6.7 GB for the CPU
        # runtime) while containerd writes its own copy
        # podman's stderr goes to a file: a pipe read only after the import could fill up
        # (64 KiB) and stall podman halfway through the archive
        with tempfile.TemporaryFile() as err:
            save = subprocess.Popen(["podman", "save", "--format", "docker-archive", ref],
                                    stdout=subprocess.PIPE, stderr=err)
            try:
                imported = run(["ctr", "--address", str(self.socket), "-n", NAMESPACE,
                                "images", "import", "-"], timeout=1800, check=False,
                               stdin=save.stdout)
            finally:
                save.stdout.close()  # type: ignore[union-attr]
                save.wait(60)
                err.seek(0)
                saved_err = err.read().decode(errors="replace")
        if save.returncode or imported.returncode:
            raise RealNodeError(f"podman save {ref} | ctr images import - exited "
                                f"{save.returncode}/{imported.returncode}: "
                                f"{saved_err.strip()[-1500:]} {imported.stderr.strip()[-1500:]}")
        if not self._has_image(ref):
            raise RealNodeError(f"containerd did not list {ref} after the import")
        self._drop_other_tags(ref)

    def _drop_other_tags(self, ref: str) -> None:
        """Removes containerd's images of `ref`'s repository with other tags (earlier
        builds); --sync waits for containerd to collect their layers and snapshots."""
        repo = ref.rsplit(":", 1)[0]
        old = [r for r in self.ctr("images", "ls", "-q", timeout=30).stdout.split()
               if r != ref and r.rsplit(":", 1)[0] == repo]
        if old:
            self.ctr("images", "rm", "--sync", *old, timeout=600, check=False)

    # -- kubelet --------------------------------------------------------------------------

    def _kubelet_files(self, st: dict[str, Any]) -> None:
        pki = Path(self.sb.pki)
        node_cert(pki, self.dir / "kubelet-client", self.name)
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "sandbox", "cluster": {
                "server": self.sb.apiserver_url, "certificate-authority": str(pki / "ca.crt")}}],
            "users": [{"name": "node", "user": {
                "client-certificate": str(self.dir / "kubelet-client.crt"),
                "client-key": str(self.dir / "kubelet-client.key")}}],
            "contexts": [{"name": "node", "context": {"cluster": "sandbox", "user": "node"}}],
            "current-context": "node",
        }
        (self.dir / "kubelet.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        config = kubelet_config(self.ip, st["ports"], pki, self.socket, self.pod_logs)
        (self.dir / "kubelet.yaml").write_text(yaml.safe_dump(config))

    def _kubelet_cmd(self, st: dict[str, Any]) -> list[str]:
        taint = f"{TAINT['key']}={TAINT['value']}:{TAINT['effect']}"
        return [
            str(self.sb.bin("kubelet")),
            f"--config={self.dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.kubelet_root}",
            f"--cert-dir={self.dir / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            f"--node-labels={LABEL}=true",
            f"--register-with-taints={taint}",
            "--v=1",
        ]

    def node(self) -> dict[str, Any] | None:
        try:
            return self.sb.api("GET", f"/api/v1/nodes/{self.name}")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def _node_ready(self) -> bool:
        node = self.node()
        return bool(node) and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in node.get("status", {}).get("conditions", []))

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """The container log files kubelet wrote for `pod` (the sandbox's apiserver has no
        kubelet client credentials, so `kubectl logs` cannot reach this kubelet)."""
        text = []
        for d in sorted(self.pod_logs.glob(f"{namespace}_{pod}_*")):
            for f in sorted(d.glob(f"{container or '*'}/*.log")):
                text.append(f.read_text(errors="replace"))
        return "\n".join(text)

    def runtime_events(self, namespace: str, pod: str) -> list[dict]:
        """The runtime's JSON log lines (`"event": ...`) in `pod`'s log, oldest first."""
        out = []
        for line in self.pod_log(namespace, pod).splitlines():
            if '"event": ' in line and "{" in line:
                try:
                    out.append(json.loads(line[line.index("{"):]))
                except json.JSONDecodeError:
                    continue  # a vLLM line that mentions an event
        return out

    # -- stop -----------------------------------------------------------------------------

    def stop(self, quiet: bool = False) -> None:
        """Pods first (through the API, then containerd), then kubelet, containerd, any shim
        left, every mount under the node's folders; the Node object is deleted. Raises when
        a process or a mount is left behind."""
        st = self.state()
        pids = st.get("pids", {})
        if pids.get("kubelet") and Path(f"/proc/{pids['kubelet']}").exists():
            self._delete_pods(timeout=30)
        self._kill(pids.get("kubelet"), "kubelet")
        if self.socket.exists() and pids.get("containerd"):
            self._remove_containers()
        self._kill(pids.get("containerd"), "containerd")
        for name in ("containerd", "kubelet"):  # earlier runs, lost state
            for pid in pids_with(str(self.dir), (name,)):
                self._kill(pid, name)
        for pid in pids_with(str(self.socket), ("containerd-shim-runc-v2",)):
            self._kill(pid, "containerd-shim-runc-v2")
        for point in mounts_under(self.dir, self.root):
            if subprocess.run(["umount", point], capture_output=True).returncode:
                subprocess.run(["umount", "-l", point], capture_output=True)
        self._clean_host_paths()
        self._clean_pod_network()
        with contextlib.suppress(Exception):
            if self.node() is not None:
                self.sb.api("DELETE", f"/api/v1/nodes/{self.name}")
        left = self.leftovers()
        if left:
            raise RealNodeError(f"left behind after stopping the real node: {left}")
        logs = Path(self.sb.state_dir) / "logs"
        if logs.is_dir():  # kept with the sandbox's own (logs.last/ after `down`)
            for f in self.dir.glob("*.log"):
                (logs / f"{self.name}-{f.name}").write_bytes(f.read_bytes())
        if self.dir.exists():
            subprocess.run(["rm", "-rf", str(self.dir)], check=False)
        if not quiet:
            print(f"[realnode] {self.name} stopped", flush=True)

    def _clean_host_paths(self) -> None:
        """kubelet also writes to fixed host paths: links to container logs in
        /var/log/containers and its device-plugin socket; ours go (and the folders, if empty
        and no other kubelet runs)."""
        logs = Path("/var/log/containers")
        for link in logs.glob("*.log") if logs.is_dir() else ():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(self.pod_logs)):
                    link.unlink()
        if pids_with("", ("kubelet",)):
            return
        plugins = Path("/var/lib/kubelet/device-plugins")
        (plugins / "kubelet.sock").unlink(missing_ok=True)
        for d in (plugins, plugins.parent, logs, Path("/run/containerd/runc/k8s.io"),
                  Path("/run/containerd/runc"), Path("/run/containerd/s")):
            with contextlib.suppress(OSError):
                d.rmdir()

    def leftovers(self) -> dict[str, list[Any]]:
        procs = (pids_with(str(self.dir), ("containerd", "kubelet"))
                 + pids_with(str(self.socket), ("containerd-shim-runc-v2",)))
        mounts = mounts_under(self.dir, self.root) if self.dir.exists() or self.root.exists() \
            else []
        netns = self._pod_namespaces()
        return {k: v for k, v in (("processes", procs), ("mounts", mounts),
                                  ("network namespaces", netns)) if v}

    def _delete_pods(self, timeout: float) -> None:
        selector = f"spec.nodeName={self.name}"
        try:
            pods = self.sb.api("GET", f"/api/v1/pods?fieldSelector={selector}")["items"]
        except Exception:
            return
        for pod in pods:
            meta = pod["metadata"]
            with contextlib.suppress(Exception):
                self.sb.api("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/"
                            f"{meta['name']}", {"gracePeriodSeconds": 0})
        # kubelet stops the containers of pods that are gone from the API
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.ctr("tasks", "ls", "-q", check=False, timeout=20)
            if out.returncode or not out.stdout.split():
                return
            time.sleep(0.5)

    def _remove_containers(self) -> None:
        for task in self.ctr("tasks", "ls", "-q", check=False, timeout=30).stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False, timeout=30)
            self.ctr("tasks", "delete", "-f", task, check=False, timeout=30)
        for c in self.ctr("containers", "ls", "-q", check=False, timeout=30).stdout.split():
            self.ctr("containers", "rm", c, check=False, timeout=30)

    @staticmethod
    def _kill(pid: int | None, name: str, timeout: float = 15) -> None:
        if not pid or not Path(f"/proc/{pid}").exists():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.1)
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)


