"""Alertmanager webhook receiver: `POST /alerts` (webhook v4) and `GET /healthz`.

    401  no or wrong bearer token (the scheme name in any case, RFC 9110; the token compared
         in constant time); nothing is read or changed
    400  malformed JSON or not a webhook payload, with the reason
    413  body over max_body_bytes or over max_alerts alerts, naming the limit
    500  the handler failed (Alertmanager retries the notification)
    200  accepted: JSON with counts of signals, ignored alerts and handler outcomes

Parsed signals go to `on_signals`, one call per request. Requests are handled concurrently:
the handler serialises decisions per MTPInference itself, so alerts for different resources
never wait for each other. The handler (the Kubernetes glue) looks each target up,
applies the policy, and reports which targets it did not find. A notification repeated within
`dedupe_seconds` (Alertmanager retries, an HA pair sending twice) is dropped here; later
repeats reach the policy, whose cooldown keeps them from acting twice. An alert that began
(firing) or ended (resolved) over `max_alert_age` seconds ago by `wall_clock`, or a firing one
whose end is already past, is ignored and counted (`stale`, `already_ended`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp import web

from mtp_operator.adapters.telemetry import AlertMetrics, operator_alert_metrics
from mtp_operator.addresses import parse_address
from mtp_operator.rollback.alertmanager import (
    PayloadError,
    TooManyAlerts,
    dedupe_key,
    parse_webhook,
)
from mtp_operator.rollback.signals import AlertSignal, PoolRef
from mtp_operator.settings import DEFAULT_MAX_ALERT_AGE_SECONDS

log = logging.getLogger(__name__)

# The bounds of one request. Alertmanager sends one POST per alert group: with the
# documented route (group_by pool and alert name) one alert a body; grouped by alertname
# only, one body holds a whole fleet's alerts, at most two per pool (our two rules). 10,000
# alerts is then 5,000 pools, past the 4,000-pod benches (bench/results/evaluator-*), and
# 8 MiB is ~840 bytes an alert, about twice a real one (our labels and annotations, the
# scrape's instance/pod/job labels). Alertmanager's webhook_config `max_alerts` (0 =
# unlimited by default) caps a body at its first N alerts: set it to at most
# DEFAULT_MAX_ALERTS where routes group wider. Beyond either bound: 413, nothing acted on.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_ALERTS = 10_000
DEFAULT_DEDUPE_SECONDS = 60.0
PARSE_IN_THREAD_BYTES = 256 * 1024  # ~700 alerts: a few ms of parsing at most in the loop
_DEDUPE_MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class ReceiveResult:
    """What the handler did with one batch of signals."""

    changed: int = 0  # signals that changed a pool's speculative settings
    unchanged: int = 0  # handled; the policy said no change
    unknown: Sequence[PoolRef | str] = ()  # targets with no such MTPInference or pool
    # accepted, not acted on, by reason: what only the resource or its namespace can tell
    # (spec.rollback.alertNames/alertMatchers, the namespace's opt-in)
    ignored: Mapping[str, int] = field(default_factory=dict)


# The handler may return a ReceiveResult or any object with the same fields; `rolled_back`
# is read as `changed` (the glue's own outcome type).
OnSignals = Callable[[list[AlertSignal]], Awaitable[Any]]


def _as_result(outcome: Any) -> ReceiveResult:
    if outcome is None or isinstance(outcome, ReceiveResult):
        return outcome or ReceiveResult()
    changed = getattr(outcome, "changed", getattr(outcome, "rolled_back", 0))
    return ReceiveResult(changed, outcome.unchanged, list(outcome.unknown),
                         dict(getattr(outcome, "ignored", None) or {}))


def _describe(ref: PoolRef | str) -> str:
    if isinstance(ref, PoolRef):
        return f"{ref.namespace}/{ref.mtpinference} {ref.gpu_product}"
    return str(ref)


MAX_NAMES_LOGGED = 5


def _log_request(received: int, signals: int, result: ReceiveResult, ignored: dict) -> None:
    """One line per request, however many alerts it carries (a 5,000-alert body is one line)."""
    if not received:
        return
    unknown = sorted({_describe(ref) for ref in result.unknown})
    shown = ", ".join(unknown[:MAX_NAMES_LOGGED])
    if len(unknown) > MAX_NAMES_LOGGED:
        shown += f" (+{len(unknown) - MAX_NAMES_LOGGED} more)"
    log.info(
        "alerts: %d received, %d signals, %d changed, %d unchanged, ignored %s%s",
        received,
        signals,
        result.changed,
        result.unchanged,
        dict(sorted(ignored.items())) or "none",
        f"; unknown pools: {shown}" if unknown else "",
    )


class _RecentKeys:
    """Keys seen within the last `ttl` seconds (bounded; oldest dropped first)."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._ttl, self._clock = ttl, clock
        self._seen: OrderedDict[tuple[object, ...], float] = OrderedDict()

    def _prune(self, now: float) -> None:
        while self._seen and (
            next(iter(self._seen.values())) <= now - self._ttl
            or len(self._seen) > _DEDUPE_MAX_ENTRIES
        ):
            self._seen.popitem(last=False)

    def contains(self, key: tuple[object, ...]) -> bool:
        self._prune(self._clock())
        return key in self._seen

    def add(self, key: tuple[object, ...]) -> None:
        self._seen[key] = self._clock()
        self._seen.move_to_end(key)

    def discard(self, key: tuple[object, ...]) -> None:
        self._seen.pop(key, None)


def make_app(
    token: str | Callable[[], str | None] | None,
    on_signals: OnSignals,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    metrics: AlertMetrics | None = None,
    dedupe_seconds: float = DEFAULT_DEDUPE_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    max_alerts: int = DEFAULT_MAX_ALERTS,
    max_alert_age: float = DEFAULT_MAX_ALERT_AGE_SECONDS,
    wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> web.Application:
    """The receiver as an aiohttp application. `token=None` turns authentication off; a
    callable is asked on every request (a token file that is re-read when it changes).
    `clock` (monotonic) times the dedupe window; `wall_clock` is what alert times are
    compared with."""
    m = metrics or AlertMetrics.create()
    max_age = timedelta(seconds=max_alert_age)

    def expected() -> bytes | None:
        current = token() if callable(token) else token
        return current.encode() if current is not None else None

    def authorized(header: str, want: bytes) -> bool:
        # `Bearer <token>`, the scheme name in any case and 1+ spaces after it (RFC 9110
        # 11.1, 11.4); the token itself compared in constant time
        scheme, _, credentials = header.partition(" ")
        given = credentials.lstrip(" ").encode("utf-8", "backslashreplace")
        return hmac.compare_digest(given, want) and scheme.lower() == "bearer"

    recent = _RecentKeys(dedupe_seconds, clock)

    def reply(code: int, rejected: str | None = None, **body: Any) -> web.Response:
        m.requests.labels(str(code)).inc()
        if rejected:
            m.rejected.labels(rejected).inc()
        return web.json_response(body, status=code)

    async def read_body(request: web.Request) -> bytes | None:
        if request.content_length is not None and request.content_length > max_body_bytes:
            return None
        body = bytearray()
        async for chunk in request.content.iter_chunked(64 * 1024):
            body += chunk
            if len(body) > max_body_bytes:
                return None
        return bytes(body)

    async def alerts(request: web.Request) -> web.Response:
        want = expected()
        if want is not None:
            if not authorized(request.headers.get("Authorization", ""), want):
                resp = reply(401, "unauthorized", error="missing or wrong bearer token")
                resp.headers["WWW-Authenticate"] = "Bearer"
                return resp
        body = await read_body(request)
        if body is None:
            return reply(413, "too_large",
                         error=f"body over {max_body_bytes} bytes, the limit a request")
        parse = partial(parse_webhook, body, max_alerts=max_alerts, now=wall_clock(),
                        max_age=max_age)
        try:
            # a large body (thousands of alerts: tens of ms of parsing) is parsed off the
            # event loop, so the requests beside it are not held up meanwhile
            parsed = (await asyncio.to_thread(parse)
                      if len(body) > PARSE_IN_THREAD_BYTES else parse())
        except TooManyAlerts as exc:
            return reply(413, "too_large", error=str(exc))
        except PayloadError as exc:
            return reply(400, "malformed", error=str(exc))

        ignored = dict(parsed.ignored)
        fresh: list[AlertSignal] = []
        keys: set[tuple[object, ...]] = set()
        for signal in parsed.signals:
            m.received.labels(signal.alert, signal.status).inc()
            key = dedupe_key(signal)
            if key in keys or recent.contains(key):
                ignored["duplicate"] = ignored.get("duplicate", 0) + 1
                continue
            keys.add(key)
            fresh.append(signal)

        result = ReceiveResult()
        if fresh:
            # Marked seen before handling, so a concurrent copy of this notification is a
            # duplicate; forgotten again on failure, so Alertmanager's retry is not.
            for key in keys:
                recent.add(key)
            try:
                result = _as_result(await on_signals(fresh))
            except Exception:
                for key in keys:
                    recent.discard(key)
                log.exception("rollback handler failed on %d alert signal(s)", len(fresh))
                return reply(500, "handler_error", error="rollback handler failed; retry")
        if result.unknown:
            ignored["unknown_target"] = len(result.unknown)
        for reason, n in result.ignored.items():
            if n:
                ignored[reason] = ignored.get(reason, 0) + n
        _log_request(parsed.received, len(fresh), result, ignored)
        for reason, n in ignored.items():
            m.ignored.labels(reason).inc(n)
        m.handled.labels("changed").inc(result.changed)
        m.handled.labels("unchanged").inc(result.unchanged)
        return reply(
            200,
            status="ok",
            received=parsed.received,
            signals=len(fresh),
            ignored=ignored,
            changed=result.changed,
            unchanged=result.unchanged,
        )

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    # aiohttp's own limit backs up read_body's for bodies read elsewhere
    app = web.Application(client_max_size=max_body_bytes + 1)
    app.router.add_post("/alerts", alerts)
    app.router.add_get("/healthz", healthz)
    return app


def make_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """Server-side TLS (1.2 or later) from a PEM certificate chain and key."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


RELOAD_SECONDS = 1.0  # how often the token and TLS files are checked for a change


class WatchedFiles:
    """A value loaded from files, loaded again when one of them changes (mtime, size or inode:
    the kubelet updates a mounted Secret by swapping a symlink). Checked at most every
    `every` seconds; a change that cannot be loaded keeps the previous value, logged once."""

    def __init__(
        self,
        paths: list[str],
        load: Callable[[], Any],
        what: str,
        every: float = RELOAD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths, self.load, self.what, self.every, self.clock = paths, load, what, every, clock
        self._seen = self._stat()
        self.value = load()
        self._checked = clock()
        self._failed: tuple[Any, ...] | None = None

    def _stat(self) -> tuple[Any, ...]:
        out = []
        for p in self.paths:
            try:
                st = os.stat(p)
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)

    def get(self) -> Any:
        now = self.clock()
        if now - self._checked < self.every:
            return self.value
        self._checked = now
        seen = self._stat()
        if seen == self._seen:
            return self.value
        try:
            self.value = self.load()
        except (OSError, ValueError, ssl.SSLError) as err:
            if seen != self._failed:
                log.error("%s changed but cannot be loaded (%s); keeping the previous one",
                          self.what, err)
                self._failed = seen
            return self.value
        self._seen, self._failed = seen, None
        log.info("%s changed: reloaded", self.what)
        return self.value


def _every(seconds: float, check: Callable[[], Any]) -> Callable[[web.Application], Any]:
    """An aiohttp cleanup context that calls `check` every `seconds` while the app runs."""

    async def ctx(_: web.Application) -> Any:
        async def loop() -> None:
            while True:
                await asyncio.sleep(seconds)
                check()

        task = asyncio.create_task(loop())
        yield
        task.cancel()

    return ctx


def read_token(token_file: str) -> str:
    token = Path(token_file).read_text().strip()
    if not token:
        raise ValueError(f"alerts token file {token_file} is empty")
    return token


async def serve_alerts(
    address: str,
    token_file: str | None,
    tls_cert_file: str | None,
    tls_key_file: str | None,
    on_signals: OnSignals,
    *,
    metrics: AlertMetrics | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    reload_seconds: float = RELOAD_SECONDS,
    max_alert_age: float = DEFAULT_MAX_ALERT_AGE_SECONDS,
) -> web.AppRunner:
    """Start the receiver on `address`; returns the runner (`await runner.cleanup()` stops it).

    Without a token file anyone who can reach the port can trigger rollbacks: a warning is
    logged. TLS needs both files. The token file and the TLS files are re-read when they
    change (a rotated Secret): the old token stops working, and new connections get the new
    certificate, within `reload_seconds`. Counters go to the operator's registry unless `metrics`
    says otherwise.
    """
    host, port = parse_address(address)
    token = None
    if token_file:
        token = WatchedFiles(
            [token_file], lambda: read_token(token_file), "alerts token file", reload_seconds
        )
    else:
        log.warning("alerts receiver on %s has no token: requests are not authenticated", address)
    if bool(tls_cert_file) != bool(tls_key_file):
        raise ValueError("TLS for the alerts receiver needs both a certificate and a key file")
    ssl_ctx = make_ssl_context(tls_cert_file, tls_key_file) if tls_cert_file else None  # type: ignore[arg-type]
    metrics = metrics or operator_alert_metrics()
    app = make_app(
        token.get if token else None,
        on_signals,
        max_body_bytes=max_body_bytes,
        metrics=metrics,
        max_alert_age=max_alert_age,
    )
    if ssl_ctx is not None:
        cert, key = str(tls_cert_file), str(tls_key_file)
        tls = WatchedFiles(
            [cert, key], lambda: ssl_ctx.load_cert_chain(cert, key), "TLS files", reload_seconds
        )
        app.cleanup_ctx.append(_every(reload_seconds, tls.get))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_ctx)
    await site.start()
    log.info("alerts receiver listening on %s%s", address, " (TLS)" if ssl_ctx else "")
    return runner
