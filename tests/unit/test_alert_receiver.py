"""Alertmanager webhook receiver over real HTTP on loopback (aiohttp's test server)."""

from __future__ import annotations

import asyncio
import json
import math
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from mtp_operator.adapters.telemetry import AlertMetrics
from mtp_operator.addresses import parse_address
from mtp_operator.control.alert_server import (
    ReceiveResult,
    make_app,
    serve_alerts,
)
from mtp_operator.rollback.alertmanager import PayloadError, parse_webhook
from mtp_operator.rollback.signals import AlertSignal, PoolRef

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
H100 = "NVIDIA-H100-80GB-HBM3"
KNOWN = {PoolRef("ml", "dsv3", H100), PoolRef("ml", "dsv3", "NVIDIA-A100-SXM4-80GB")}


def alert(
    name: str = "MTPHitRateLow",
    status: str = "firing",
    *,
    value: str | None = "0.7",
    mtpinference: str = "dsv3",
    gpu: str = H100,
    fingerprint: str = "f1",
    starts: str = "2026-11-29T12:00:00.123456789Z",
    **labels: str,
) -> dict[str, Any]:
    ann = {"summary": "s", "description": "d", "threshold": "0.88"}
    if value is not None:
        ann["value"] = value
    return {
        "status": status,
        "labels": {
            "alertname": name,
            "namespace": "ml",
            "mtpinference": mtpinference,
            "gpu_product": gpu,
            "severity": "warning",
            **labels,
        },
        "annotations": ann,
        "startsAt": starts,
        "endsAt": "2026-11-29T12:10:00Z" if status == "resolved" else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fingerprint,
    }


def payload(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": "4",
        "groupKey": '{}:{alertname="MTPHitRateLow"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "mtp-operator",
        "groupLabels": {"alertname": "MTPHitRateLow"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


class Handler:
    """Stands in for the Kubernetes glue: records batches, knows two pools."""

    def __init__(self, fail: bool = False, delay: float = 0.0) -> None:
        self.batches: list[list[AlertSignal]] = []
        self.fail, self.delay = fail, delay
        self.active = 0
        self.max_active = 0

    @property
    def signals(self) -> list[AlertSignal]:
        return [s for b in self.batches for s in b]

    async def __call__(self, signals: list[AlertSignal]) -> ReceiveResult:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail:
                raise RuntimeError("API server unreachable")
            self.batches.append(signals)
            unknown = [s.target for s in signals if s.target not in KNOWN]
            return ReceiveResult(changed=0, unchanged=len(signals) - len(unknown), unknown=unknown)
        finally:
            self.active -= 1


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def handler() -> Handler:
    return Handler()


@pytest.fixture
def metrics() -> AlertMetrics:
    return AlertMetrics.create()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def client(
    handler: Handler, metrics: AlertMetrics, clock: Clock
) -> AsyncIterator[TestClient]:
    app = make_app(TOKEN, handler, max_body_bytes=1_000_000, metrics=metrics, clock=clock)
    async with TestClient(TestServer(app)) as c:
        yield c


def count(m: AlertMetrics, counter: str, **labels: str) -> float:
    c = getattr(m, counter)
    return c.labels(**labels)._value.get() if labels else c._value.get()


async def post(client: TestClient, body: Any, headers: dict[str, str] | None = None) -> Any:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    resp = await client.post("/alerts", data=data, headers=AUTH if headers is None else headers)
    return resp.status, await resp.json()


# ---- authentication -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": ""}],
    ids=["none", "wrong", "no-scheme", "empty"],
)
async def test_unauthorized_changes_nothing(
    client: TestClient, handler: Handler, metrics: AlertMetrics, headers: dict[str, str]
) -> None:
    resp = await client.post("/alerts", json=payload(alert()), headers=headers)
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert handler.batches == []
    assert count(metrics, "rejected", reason="unauthorized") == 1
    assert count(metrics, "received", alertname="MTPHitRateLow", status="firing") == 0


async def test_no_token_means_no_auth(handler: Handler) -> None:
    async with TestClient(TestServer(make_app(None, handler))) as c:
        status, _ = await post(c, payload(alert()), headers={})
    assert status == 200 and len(handler.signals) == 1


async def test_healthz(client: TestClient) -> None:
    resp = await client.get("/healthz")
    assert resp.status == 200 and (await resp.text()).strip() == "ok"


# ---- bad requests ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "malformed JSON"),
        (b"\xff\xfe", "malformed JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (json.dumps({"version": "4"}), "alerts: Field required"),
        (json.dumps({"alerts": [{"labels": {}}]}), "alerts.0.status: Field required"),
        (json.dumps({"alerts": [{"status": "weird", "labels": {}}]}), "alerts.0.status"),
        (json.dumps({"alerts": [{"status": "firing", "labels": {"a": 1}}]}), "labels.a"),
        (json.dumps({"version": "3", "alerts": []}), "unsupported webhook version '3'"),
    ],
)
async def test_malformed_is_400_with_a_reason(
    client: TestClient, handler: Handler, metrics: AlertMetrics, body: Any, message: str
) -> None:
    status, reply = await post(client, body)
    assert status == 400
    assert message in reply["error"]
    assert handler.batches == []
    assert count(metrics, "rejected", reason="malformed") == 1


async def test_oversized_body_is_413(client: TestClient, handler: Handler, metrics: AlertMetrics):
    big = payload(*[alert(fingerprint=f"f{i}") for i in range(3000)])  # > 1 MB
    status, reply = await post(client, big)
    assert status == 413 and "1000000 bytes" in reply["error"]
    assert handler.batches == []
    assert count(metrics, "rejected", reason="too_large") == 1


async def test_oversized_chunked_body_is_413(client: TestClient, handler: Handler) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b" " * 100_000

    resp = await client.post("/alerts", data=chunks(), headers=AUTH)
    assert resp.status == 413 and handler.batches == []


async def test_handler_failure_is_500_and_the_retry_is_not_a_duplicate(
    metrics: AlertMetrics,
) -> None:
    failing = Handler(fail=True)
    app = make_app(TOKEN, failing, metrics=metrics)
    async with TestClient(TestServer(app)) as c:
        status, reply = await post(c, payload(alert()))
        assert status == 500 and "retry" in reply["error"]
        failing.fail = False
        status, reply = await post(c, payload(alert()))
        assert status == 200 and reply["signals"] == 1
    assert count(metrics, "rejected", reason="handler_error") == 1


# ---- parsing and routing --------------------------------------------------------------------


async def test_ok_with_parsed_signals(
    client: TestClient, handler: Handler, metrics: AlertMetrics
) -> None:
    body = payload(
        alert(),
        alert(
            "MTPErrorPropagationHigh", value="0.52", gpu="NVIDIA-A100-SXM4-80GB", fingerprint="f2"
        ),
        alert("KubePodCrashLooping", fingerprint="f3"),
        alert(fingerprint="f4", mtpinference=""),  # no target: accepted, ignored
    )
    status, reply = await post(client, body)
    assert status == 200
    assert reply == {
        "status": "ok",
        "received": 4,
        "signals": 2,
        "ignored": {"not_rollback_alert": 1, "missing_labels": 1},
        "changed": 0,
        "unchanged": 2,
    }
    first, second = handler.signals
    assert first.alert == "MTPHitRateLow" and first.status == "firing"
    assert first.target == PoolRef("ml", "dsv3", H100)
    assert (first.value, first.threshold, first.via) == (0.7, 0.88, "alertmanager")
    assert first.starts_at is not None and first.starts_at.isoformat().startswith(
        "2026-11-29T12:00:00.123456"
    )
    assert first.ends_at is None  # Alertmanager's zero time
    assert first.fingerprint == "f1"
    assert (second.alert, second.value, second.target.gpu_product) == (
        "MTPErrorPropagationHigh",
        0.52,
        "NVIDIA-A100-SXM4-80GB",
    )
    assert count(metrics, "ignored", reason="not_rollback_alert") == 1
    assert count(metrics, "ignored", reason="missing_labels") == 1
    assert count(metrics, "received", alertname="MTPHitRateLow", status="firing") == 1
    assert count(metrics, "requests", code="200") == 1


def test_value_from_label_and_no_data() -> None:
    a = alert(value=None, fingerprint="a")
    a["labels"]["value"] = "0.61"
    b = alert(value="NaN", fingerprint="b")
    c = alert(value="n/a", fingerprint="c")
    d = alert(value=None, fingerprint="d")
    parsed = parse_webhook(json.dumps(payload(a, b, c, d)).encode())
    values = [s.value for s in parsed.signals]
    assert values[0] == 0.61 and math.isnan(values[1]) and values[2:] == [None, None]
    assert [s.has_value for s in parsed.signals] == [True, False, False, False]


def test_parse_webhook_errors_are_payload_errors() -> None:
    with pytest.raises(PayloadError, match="malformed JSON"):
        parse_webhook(b"")


async def test_unknown_target_is_accepted_and_counted(
    client: TestClient, handler: Handler, metrics: AlertMetrics
) -> None:
    status, reply = await post(client, payload(alert(mtpinference="gone"), alert(fingerprint="x")))
    assert status == 200
    assert reply["ignored"] == {"unknown_target": 1} and reply["unchanged"] == 1
    assert count(metrics, "ignored", reason="unknown_target") == 1


async def test_resolved_passes_through(client: TestClient, handler: Handler) -> None:
    status, _ = await post(client, payload(alert(status="resolved")))
    assert status == 200
    (s,) = handler.signals
    assert s.status == "resolved" and s.ends_at is not None and s.ends_at.minute == 10


async def test_duplicates_are_dropped_until_the_ttl_passes(
    client: TestClient, handler: Handler, metrics: AlertMetrics, clock: Clock
) -> None:
    body = payload(alert(), alert())  # the same alert twice in one notification
    status, reply = await post(client, body)
    assert reply["signals"] == 1 and reply["ignored"] == {"duplicate": 1}
    clock.t += 30
    status, reply = await post(client, payload(alert()))  # Alertmanager retry / HA twin
    assert status == 200 and reply["signals"] == 0 and reply["ignored"] == {"duplicate": 1}
    # the resolved notification of the same alert is a different notification
    status, reply = await post(client, payload(alert(status="resolved")))
    assert reply["signals"] == 1
    clock.t += 31  # past the 60 s TTL: a repeat reaches the policy (whose cooldown holds it)
    status, reply = await post(client, payload(alert()))
    assert reply["signals"] == 1
    assert [s.status for s in handler.signals] == ["firing", "resolved", "firing"]
    assert count(metrics, "ignored", reason="duplicate") == 2


# ---- bursts ---------------------------------------------------------------------------------


async def test_burst_of_1000_alerts_in_one_request(client: TestClient, handler: Handler) -> None:
    alerts = [
        alert(
            fingerprint=f"f{i}",
            mtpinference="dsv3" if i % 50 == 0 else f"m{i}",
            value=str(0.5 + i / 10_000),
        )
        for i in range(1000)
    ]
    status, reply = await post(client, payload(*alerts))
    assert status == 200 and reply["signals"] == 1000
    assert len(handler.batches) == 1 and len(handler.signals) == 1000
    assert reply["ignored"] == {"unknown_target": 980} and reply["unchanged"] == 20


async def test_burst_of_1000_requests_concurrently(metrics: AlertMetrics) -> None:
    slow = Handler(delay=0.001)
    app = make_app(TOKEN, slow, metrics=metrics)
    async with TestClient(TestServer(app)) as c:

        async def one(i: int) -> int:
            resp = await c.post("/alerts", json=payload(alert(fingerprint=f"f{i}")), headers=AUTH)
            return resp.status

        statuses = await asyncio.gather(*(one(i) for i in range(1000)))
        health = await c.get("/healthz")  # still serving right after the burst
    assert statuses == [200] * 1000 and health.status == 200
    assert len(slow.signals) == 1000
    # requests are handled concurrently (the handler serialises per resource itself)
    assert slow.max_active > 1
    assert count(metrics, "requests", code="200") == 1000


# ---- serving --------------------------------------------------------------------------------


def test_parse_address() -> None:
    assert parse_address("0.0.0.0:9443") == ("0.0.0.0", 9443)
    assert parse_address(":9443") == (None, 9443)
    assert parse_address("[::1]:9443") == ("::1", 9443)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address("localhost")


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cryptography is a test dependency)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


async def test_serve_alerts_with_token_file_and_tls(
    tmp_path: Path, handler: Handler, tls_files: tuple[Path, Path]
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    cert, key = tls_files
    runner = await serve_alerts(
        "127.0.0.1:0", str(tmp_path / "token"), str(cert), str(key), handler
    )
    try:
        host, port = runner.addresses[0][:2]
        ctx = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as session:
            url = f"https://{host}:{port}/alerts"
            async with session.post(url, json=payload(alert()), ssl=ctx) as resp:
                assert resp.status == 401
            async with session.post(url, json=payload(alert()), headers=AUTH, ssl=ctx) as resp:
                assert resp.status == 200
    finally:
        await runner.cleanup()
    assert len(handler.signals) == 1


async def test_serve_alerts_refuses_an_empty_token_file(tmp_path: Path, handler: Handler) -> None:
    (tmp_path / "token").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        await serve_alerts("127.0.0.1:0", str(tmp_path / "token"), None, None, handler)


async def test_handler_may_return_its_own_outcome_type() -> None:
    """The glue's Outcome (rolled_back, unchanged, unknown as strings) is read as a result."""

    class Outcome:
        def __init__(self) -> None:
            self.rolled_back, self.unchanged, self.unknown = 1, 0, ["ml/gone"]

    async def glue(signals: list[AlertSignal]) -> Outcome:
        return Outcome()

    metrics = AlertMetrics.create()
    async with TestClient(TestServer(make_app(TOKEN, glue, metrics=metrics))) as c:
        status, reply = await post(c, payload(alert(), alert(fingerprint="f2")))
    assert status == 200 and reply["changed"] == 1 and reply["ignored"] == {"unknown_target": 1}
    assert count(metrics, "handled", outcome="changed") == 1


async def test_serve_alerts_without_token_or_tls(handler: Handler) -> None:
    from mtp_operator.adapters.telemetry import REGISTRY

    before = REGISTRY.get_sample_value("mtp_operator_alert_requests_total", {"code": "200"}) or 0
    runner = await serve_alerts("127.0.0.1:0", None, None, None, handler)
    try:
        host, port = runner.addresses[0][:2]
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://{host}:{port}/alerts", json=payload(alert())) as r:
                assert r.status == 200
            async with session.get(f"http://{host}:{port}/healthz") as r:
                assert r.status == 200
    finally:
        await runner.cleanup()
    # counted in the operator's own registry, which its /metrics serves
    after = REGISTRY.get_sample_value("mtp_operator_alert_requests_total", {"code": "200"})
    assert after == before + 1
