"""The LeaderWorkerSet controller (sigs.k8s.io/lws, built by build.sh) run against the sandbox.

Real: the manager binary of the module's cmd/ (its LeaderWorkerSet and pod controllers and its
webhooks: the LWS defaulting/validation and the pod webhook that gives each group's pods their
labels, LWS_* environment and worker StatefulSet), the module's CRD and its webhook
configurations with the module's own patch (the pod webhooks only see pods labelled
`leaderworkerset.sigs.k8s.io/name`).

What differs from the module's deployment (config/default), and why:
- it runs as a local process, not a pod: the sandbox runs no containers;
- its internal cert manager is off (`internalCertManagement.enable: false` in its --config file):
  it would write its serving certificate into a Secret and patch the webhook configurations'
  caBundle, for a Service that nothing routes here (no kube-proxy). Instead a serving
  certificate for 127.0.0.1 is signed by the sandbox CA, put in `webhook.certDir`, and the
  webhook configurations point at `https://127.0.0.1:<port>/<path>` (clientConfig.url) with
  the sandbox CA as caBundle; the module's service-based clientConfig is replaced by that url;
- leader election off (--leader-elect=false), metrics off (`metrics.bindAddress: "0"`), the
  health probe on a free loopback port;
- it talks to the API server as the sandbox admin (the kubeconfig of `system:masters`), not
  through the module's RBAC.

One controller per sandbox state dir: `start()` reuses a live one (its pid and ports in
<state>/lws/state.json); `stop()` stops it and deletes the webhook configurations (their
failurePolicy is Fail: left behind, they would refuse every LeaderWorkerSet).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import ipaddress
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
MUTATING = "mtp-sandbox-lws-mutating"
VALIDATING = "mtp-sandbox-lws-validating"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def webhook_configurations(webhook_dir: Path, url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The module's Mutating/ValidatingWebhookConfiguration (config/webhook/manifests.yaml
    with its mutating-/validating-patch.yaml applied: each replaces /webhooks/1, the pod
    webhook, with one carrying the objectSelector), each webhook called at `url` + its path."""
    import base64

    docs = [d for d in yaml.safe_load_all((webhook_dir / "manifests.yaml").read_text()) if d]
    patches = {"MutatingWebhookConfiguration": "mutating-patch.yaml",
               "ValidatingWebhookConfiguration": "validating-patch.yaml"}
    names = {"MutatingWebhookConfiguration": MUTATING,
             "ValidatingWebhookConfiguration": VALIDATING}
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        for op in yaml.safe_load((webhook_dir / patches[doc["kind"]]).read_text()):
            assert op["op"] == "replace" and op["path"].startswith("/webhooks/"), op
            doc["webhooks"][int(op["path"].rsplit("/", 1)[1])] = op["value"]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url + path,
                                    "caBundle": base64.b64encode(ca_pem).decode()}
        doc["metadata"] = {"name": names[doc["kind"]]}
        out.append(doc)
    return out


class LwsController:
    def __init__(self, sandbox: Any) -> None:
        self.sb = sandbox
        self.home = Path(sandbox.bin("lws"))  # the cached build: lws-manager, crds/, webhook/
        self.dir = Path(sandbox.state_dir) / "lws"
        self.state_file = self.dir / "state.json"
        self.log = self.dir / "lws-manager.log"

    # -- state ------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def healthy(self) -> bool:
        st = self._state()
        if not _alive(st.get("pid")):
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{st['health']}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    # -- parts --------------------------------------------------------------------------------
    def install_crd(self) -> None:
        crd = self.home / "crds" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
        self.sb.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            p = self.sb.kubectl("get", "crd", CRD_NAME, "-o", "json", check=False)
            if p.returncode == 0 and any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in (json.loads(p.stdout).get("status") or {}).get("conditions") or []
            ):
                return
            time.sleep(0.3)
        raise TimeoutError(f"CRD {CRD_NAME} not Established")

    def _serving_cert(self, certs: Path) -> None:
        """tls.crt/tls.key for 127.0.0.1, signed by the sandbox CA."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        pki = Path(self.sb.pki)
        ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
        ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
        key = ec.generate_private_key(ec.SECP256R1())
        now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(hours=1)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lws-webhook")]))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + _dt.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        certs.mkdir(parents=True, exist_ok=True)
        (certs / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (certs / "tls.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption()))
        (certs / "tls.key").chmod(0o600)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> LwsController:
        """CRD, the manager process, its webhook configurations; a live one is reused."""
        self.install_crd()
        if self.healthy():
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        webhook, health = _free_port(), _free_port()
        certs = self.dir / "certs"
        self._serving_cert(certs)
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "internalCertManagement": {"enable": False},
            "leaderElection": {"leaderElect": False},
            "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        }
        (self.dir / "config.yaml").write_text(yaml.safe_dump(config))
        cmd = [str(self.home / "lws-manager"), f"--config={self.dir / 'config.yaml'}",
               f"--kubeconfig={self.sb.kubeconfig}", "--leader-elect=false",
               "--zap-devel=false", "--zap-log-level=info"]
        with open(self.log, "ab") as log:
            log.write(f"\n==== {time.strftime('%F %T')} {' '.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env={k: v for k, v in os.environ.items()
                                         if k != "KUBECONFIG"})
        self.state_file.write_text(json.dumps({"pid": proc.pid, "webhook": webhook,
                                               "health": health}))
        ca = (Path(self.sb.pki) / "ca.crt").read_bytes()
        for doc in webhook_configurations(self.home / "webhook",
                                          f"https://127.0.0.1:{webhook}", ca):
            self.sb.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                            input=yaml.safe_dump(doc))
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"lws-manager not ready (exit {proc.poll()}); log:\n{tail}")
            time.sleep(0.3)
        return self

    def stop(self) -> None:
        for kind, name in (("mutatingwebhookconfiguration", MUTATING),
                           ("validatingwebhookconfiguration", VALIDATING)):
            self.sb.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        pid = self._state().get("pid")
        if _alive(pid):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
                time.sleep(0.1)
            if _alive(pid):
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        self.state_file.unlink(missing_ok=True)
