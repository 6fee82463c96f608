"""The sandbox's certificates (one CA, component and admin leaves) and kubeconfigs."""

from __future__ import annotations

import datetime as _dt
import ipaddress
from collections.abc import Sequence
from pathlib import Path

import yaml

from sandbox_lib.common import SERVICE_CIDR


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
