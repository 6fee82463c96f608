"""Alertmanager webhook receiver over real HTTP on loopback (aiohttp's test server)."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
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
# The alerts began a few minutes ago (the receiver ignores alerts that began too long ago) and
# the resolved ones ended at import time.
STARTS = (datetime.now(UTC) - timedelta(minutes=10)).replace(microsecond=0)
ENDS = STARTS + timedelta(minutes=10)


def rfc3339(t: datetime, fraction: str = "") -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


def alert(
    name: str = "MTPHitRateLow",
    status: str = "firing",
    *,
    value: str | None = "0.7",
    mtpinference: str = "dsv3",
    gpu: str = H100,
    fingerprint: str = "f1",
    starts: str = rfc3339(STARTS, ".123456789"),
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
        "endsAt": rfc3339(ENDS) if status == "resolved" else "0001-01-01T00:00:00Z",
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
        STARTS.strftime("%Y-%m-%dT%H:%M:%S") + ".123456"
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
    assert values == [0.61, None, None]  # NaN is no figure at all: ignored (below)
    assert [s.has_value for s in parsed.signals] == [True, False, False]
    assert parsed.ignored["impossible_value"] == 1


@pytest.mark.parametrize("value", ["1.5", "-0.01", "NaN", "Inf", "-Inf", "1e309"])
def test_impossible_values_are_ignored_and_counted(value: str) -> None:
    firing = alert(value=value, fingerprint="f")
    resolved = alert(value=value, fingerprint="r")
    resolved["status"] = "resolved"
    parsed = parse_webhook(json.dumps(payload(firing, resolved)).encode())
    assert [s.status for s in parsed.signals] == ["resolved"]  # a resolve is still a resolve
    assert parsed.ignored == {"impossible_value": 1}
    # the boundaries themselves are valid ratios
    edge = parse_webhook(json.dumps(payload(alert(value="0"), alert(value="1.0",
                                                                     fingerprint="o"))).encode())
    assert [s.value for s in edge.signals] == [0.0, 1.0] and not edge.ignored


def test_a_class_label_names_the_class_pool() -> None:
    # the rules keep class pools apart by `traffic_class` (the relabelled pod label
    # mtp-operator.io/traffic-class); the alert's pool is then `product/class`, the key the
    # evaluator and the status use. Empty is Prometheus's "no label": the unclassed pool.
    parsed = parse_webhook(json.dumps(payload(
        alert(fingerprint="a", traffic_class="long"),
        alert(fingerprint="b", traffic_class=""),
        alert(fingerprint="c"),
    )).encode())
    assert [s.target for s in parsed.signals] == [
        PoolRef("ml", "dsv3", f"{H100}/long"), PoolRef("ml", "dsv3", H100),
        PoolRef("ml", "dsv3", H100),
    ]
    assert not parsed.ignored
    # a class alone names no pool: ignored as before
    no_product = alert(fingerprint="d", gpu="", traffic_class="long")
    assert parse_webhook(json.dumps(payload(no_product)).encode()).ignored == {
        "missing_labels": 1}


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


async def test_reasons_the_handler_ignores_alerts_for_are_answered_and_counted(
    metrics: AlertMetrics, clock: Clock
) -> None:
    """The handler refuses alerts for reasons only the resource or its namespace can tell
    (spec.rollback.alertNames, the namespace's opt-in; control/rollback.AlertOutcome.ignored):
    accepted (200, Alertmanager must not retry) and counted like the parser's reasons."""
    from mtp_operator.control.rollback import AlertOutcome

    async def refusing(signals: list[AlertSignal]) -> AlertOutcome:
        out = AlertOutcome()
        out.ignored["namespace_not_opted_in"] += len(signals) - 1
        out.ignored["not_allowed_by_resource"] += 1
        return out

    app = make_app(TOKEN, refusing, metrics=metrics, clock=clock)
    async with TestClient(TestServer(app)) as c:
        status, reply = await post(c, payload(
            alert(), alert(fingerprint="2"), alert(fingerprint="3", name="Other")))
    assert status == 200
    assert reply["ignored"] == {"namespace_not_opted_in": 1, "not_allowed_by_resource": 1,
                                "not_rollback_alert": 1}
    assert (reply["changed"], reply["unchanged"]) == (0, 0)
    assert count(metrics, "ignored", reason="namespace_not_opted_in") == 1
    assert count(metrics, "ignored", reason="not_allowed_by_resource") == 1


async def test_resolved_passes_through(client: TestClient, handler: Handler) -> None:
    status, _ = await post(client, payload(alert(status="resolved")))
    assert status == 200
    (s,) = handler.signals
    assert s.status == "resolved" and s.ends_at == ENDS


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
    return _self_signed(tmp_path / "tls.crt", tmp_path / "tls.key")


def _self_signed(cert_file: Path, key_file: Path) -> tuple[Path, Path]:
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


# ---- hostile bodies -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 200_000,
        b'{"alerts": ' + b"[" * 100_000,
        b'{"alerts": [' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"]}",
        json.dumps({"alerts": [[]] * 200_000}).encode(),
        json.dumps({"alerts": [{"status": "firing", "labels": {"x": [1] * 100_000}}]}).encode(),
    ],
    ids=["deep-array", "deep-unclosed", "deep-objects", "huge-array", "huge-inner-array"],
)
async def test_hostile_json_is_a_4xx_never_a_500(
    client: TestClient, handler: Handler, body: bytes
) -> None:
    resp = await client.post("/alerts", data=body, headers={"Authorization": f"Bearer {TOKEN}"})
    error = (await resp.json())["error"]
    if body.startswith(b'{"alerts": [[]'):  # 200,000 alerts: refused on their count alone
        assert resp.status == 413 and "over the limit of 10000" in error
    else:
        assert resp.status == 400, error
        assert "not an Alertmanager webhook payload" in error or "malformed JSON" in error
    assert handler.batches == []


async def test_one_log_line_per_request_however_many_alerts(
    handler: Handler, metrics: AlertMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="mtp_operator")
    alerts = [alert(fingerprint=f"f{i}", mtpinference=f"gone-{i}") for i in range(5000)]
    async with TestClient(TestServer(make_app(TOKEN, handler, metrics=metrics))) as client:
        status, reply = await post(client, payload(*alerts))
    assert status == 200 and reply["ignored"] == {"unknown_target": 5000}
    lines = [r for r in caplog.records if r.name.startswith("mtp_operator")]
    assert len(lines) == 1, len(lines)
    assert "5000 received" in lines[0].getMessage() and "+4995 more" in lines[0].getMessage()


# ---- rotated Secrets ------------------------------------------------------------------------


def _swap(path: Path, content: bytes) -> None:
    """Replace `path` the way the kubelet updates a mounted Secret: a new file, renamed over."""
    new = path.with_name(path.name + ".new")
    new.write_bytes(content)
    new.replace(path)


async def test_a_rotated_token_file_is_reread_and_the_old_token_stops_working(
    tmp_path: Path, handler: Handler
) -> None:
    token = tmp_path / "token"
    token.write_text("first-token-0123456789\n")
    runner = await serve_alerts("127.0.0.1:0", str(token), None, None, handler,
                                reload_seconds=0.05)
    try:
        host, port = runner.addresses[0][:2]
        url = f"http://{host}:{port}/alerts"

        async def status(tok: str, fp: str) -> int:
            async with session.post(url, json=payload(alert(fingerprint=fp)),
                                    headers={"Authorization": f"Bearer {tok}"}) as r:
                return r.status

        async with aiohttp.ClientSession() as session:
            assert await status("first-token-0123456789", "a") == 200
            _swap(token, b"second-token-9876543210\n")
            await asyncio.sleep(0.1)  # the bound: reload_seconds
            assert await status("first-token-0123456789", "b") == 401
            assert await status("second-token-9876543210", "c") == 200
            _swap(token, b"\n")  # a broken rotation keeps the last good token
            await asyncio.sleep(0.1)
            assert await status("second-token-9876543210", "d") == 200
    finally:
        await runner.cleanup()


async def test_rotated_tls_files_serve_the_new_certificate(
    tmp_path: Path, handler: Handler
) -> None:
    cert, key = _self_signed(tmp_path / "tls.crt", tmp_path / "tls.key")
    (tmp_path / "token").write_text(TOKEN)
    runner = await serve_alerts("127.0.0.1:0", str(tmp_path / "token"), str(cert), str(key),
                                handler, reload_seconds=0.05)
    try:
        host, port = runner.addresses[0][:2]

        def served_cert() -> bytes:
            import socket

            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            with socket.create_connection((host, port), timeout=5) as raw:
                with ctx.wrap_socket(raw) as tls:
                    return tls.getpeercert(binary_form=True)

        first = await asyncio.to_thread(served_cert)
        new_cert, new_key = _self_signed(tmp_path / "n.crt", tmp_path / "n.key")
        _swap(key, new_key.read_bytes())
        _swap(cert, new_cert.read_bytes())
        await asyncio.sleep(0.2)
        second = await asyncio.to_thread(served_cert)
        assert first != second
        assert ssl.DER_cert_to_PEM_cert(second).strip() == new_cert.read_text().strip()
    finally:
        await runner.cleanup()


# ---- hardening (issue 36) -------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
async def test_the_auth_scheme_is_case_insensitive(
    client: TestClient, handler: Handler, scheme: str
) -> None:
    """RFC 9110 11.1: the scheme name is case-insensitive; the token is not."""
    status, _ = await post(client, payload(alert()), {"Authorization": f"{scheme} {TOKEN}"})
    assert status == 200 and len(handler.signals) == 1
    status, _ = await post(client, payload(alert(fingerprint="f2")),
                           {"Authorization": f"{scheme} {TOKEN.upper()}"})
    assert status == 401


async def test_too_many_alerts_is_413_naming_the_limit(
    handler: Handler, metrics: AlertMetrics
) -> None:
    app = make_app(TOKEN, handler, metrics=metrics, max_alerts=100)
    async with TestClient(TestServer(app)) as c:
        status, reply = await post(c, payload(*[alert(fingerprint=f"f{i}") for i in range(101)]))
        assert status == 413
        assert "101 alerts" in reply["error"] and "100" in reply["error"]
        assert "max_alerts" in reply["error"]  # what to set in Alertmanager
        status, reply = await post(c, payload(*[alert(fingerprint=f"f{i}") for i in range(100)]))
        assert status == 200 and reply["signals"] == 100
    assert count(metrics, "rejected", reason="too_large") == 1
    assert len(handler.batches) == 1


def test_the_default_limits_fit_what_alertmanager_sends() -> None:
    """8 MiB and 10,000 alerts: a fleet-wide group of both rollback alerts for 5,000 pools."""
    from mtp_operator.control import alert_server

    assert alert_server.DEFAULT_MAX_ALERTS == 10_000
    assert alert_server.DEFAULT_MAX_BODY_BYTES == 8 * 1024 * 1024
    # one realistic alert (our labels, annotations, Alertmanager's fields) is well under
    # the bytes per alert the byte limit allows at the alert limit
    one = len(json.dumps(alert(instance="10.0.0.1:8000", pod="p" * 40, job="mtp-pods")))
    assert one < alert_server.DEFAULT_MAX_BODY_BYTES / alert_server.DEFAULT_MAX_ALERTS


NOW = STARTS + timedelta(hours=1)


@pytest.fixture
async def dated(handler: Handler, metrics: AlertMetrics) -> AsyncIterator[TestClient]:
    """A receiver whose wall clock says NOW, ignoring alerts that began over 2 h before."""
    app = make_app(TOKEN, handler, metrics=metrics, wall_clock=lambda: NOW,
                   max_alert_age=7200.0)
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_stale_and_ended_alerts_are_ignored_and_counted(
    dated: TestClient, handler: Handler, metrics: AlertMetrics
) -> None:
    old = alert(fingerprint="old", starts=rfc3339(NOW - timedelta(hours=2, seconds=1)))
    edge = alert(fingerprint="edge", starts=rfc3339(NOW - timedelta(hours=2)))
    ended = alert(fingerprint="ended")  # says firing, but its end is already past
    ended["endsAt"] = rfc3339(NOW - timedelta(seconds=1))
    ending = alert(fingerprint="ending")  # an end still to come: firing
    ending["endsAt"] = rfc3339(NOW + timedelta(minutes=4))
    old_resolve = alert(status="resolved", fingerprint="oldres",
                        starts=rfc3339(NOW - timedelta(hours=5)))
    old_resolve["endsAt"] = rfc3339(NOW - timedelta(hours=2, seconds=1))
    long_resolve = alert(status="resolved", fingerprint="longres",
                         starts=rfc3339(NOW - timedelta(hours=5)))
    long_resolve["endsAt"] = rfc3339(NOW - timedelta(minutes=1))  # a long alert, just over
    status, reply = await post(
        dated, payload(old, edge, ended, ending, old_resolve, long_resolve, alert())
    )
    assert status == 200
    assert reply["ignored"] == {"stale": 2, "already_ended": 1}
    assert sorted(s.fingerprint or "" for s in handler.signals) == [
        "edge", "ending", "f1", "longres"
    ]
    assert count(metrics, "ignored", reason="stale") == 2
    assert count(metrics, "ignored", reason="already_ended") == 1


async def test_a_stale_alert_is_never_obeyed_however_often_sent(
    dated: TestClient, handler: Handler
) -> None:
    old = alert(fingerprint="old", starts=rfc3339(NOW - timedelta(hours=3)))
    for _ in range(3):
        status, reply = await post(dated, payload(old))
        assert status == 200 and reply["signals"] == 0 and reply["ignored"] == {"stale": 1}
    assert handler.batches == []


def test_the_age_bound_is_a_setting_with_a_default() -> None:
    from mtp_operator.control import alert_server
    from mtp_operator.settings import OperatorSettings

    settings = OperatorSettings.model_validate({"alerts": {"maxAlertAgeSeconds": 600}})
    assert settings.alerts.max_alert_age_seconds == 600
    assert OperatorSettings().alerts.max_alert_age_seconds == 3 * 3600
    assert alert_server.DEFAULT_MAX_ALERT_AGE_SECONDS == 3 * 3600
    with pytest.raises(ValueError):
        OperatorSettings.model_validate({"alerts": {"maxAlertAgeSeconds": 0}})


def test_parse_webhook_screens_by_age_only_with_a_clock() -> None:
    old = alert(starts=rfc3339(NOW - timedelta(days=30)))
    body = json.dumps(payload(old)).encode()
    assert len(parse_webhook(body).signals) == 1  # pure parsing: no clock, no screening
    parsed = parse_webhook(body, now=NOW, max_age=timedelta(hours=3))
    assert parsed.signals == [] and parsed.ignored == {"stale": 1}


async def test_a_large_valid_body_takes_time_linear_in_its_size(
    handler: Handler, metrics: AlertMetrics
) -> None:
    def body(n: int) -> bytes:
        return json.dumps(payload(*[alert(fingerprint=f"f{i}", mtpinference=f"m{i % 997}")
                                    for i in range(n)])).encode()

    small, large = body(1000), body(8000)
    app = make_app(TOKEN, handler, metrics=metrics, max_body_bytes=16 * 1024 * 1024)
    async with TestClient(TestServer(app)) as c:
        await post(c, body(100))  # warm up

        async def took(data: bytes) -> float:
            t0 = time.perf_counter()
            status, _ = await post(c, data)
            assert status == 200
            return time.perf_counter() - t0

        # best of 2 against a busy machine; 8x the alerts: linear ~8x, quadratic ~64x
        t_small = min([await took(small), await took(small)])
        t_large = min([await took(large), await took(large)])
    assert t_large < 24 * t_small + 0.5, (t_small, t_large)
