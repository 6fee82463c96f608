"""Small HTTP servers for monitoring tests: a static /metrics target and a webhook receiver
that records what Alertmanager posts."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox_lib.monitor_process import MonitoringError


class _QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server:
    """A threaded HTTP server on a free loopback port; a context manager."""

    def __init__(
        self, handler: type[http.server.BaseHTTPRequestHandler], host: str, port: int | None
    ) -> None:
        self.host = host
        self.httpd = http.server.ThreadingHTTPServer((host, port or 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self):
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, daemon=True, kwargs={"poll_interval": 0.1}
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MetricsServer(_Server):
    """Serves `text` (Prometheus exposition format) at /metrics; set `.text` to change it.

    `host` may be any loopback address, e.g. a kwok pod IP from 127.64.0.0/16."""

    def __init__(self, text: str = "", *, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.text = text
        self.scrapes = 0

        class Handler(_QuietHandler):
            def do_GET(self) -> None:
                owner: MetricsServer = self.server.owner  # type: ignore[attr-defined]
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                owner.scrapes += 1
                body = owner.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler, host, port)


@dataclass
class WebhookRequest:
    """One POST the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


class WebhookReceiver(_Server):
    """Records every POST (path, lower-cased headers, body); answers `status` (default 200).

    ``wait_for(pred)`` blocks until a request satisfies `pred` and returns it."""

    def __init__(
        self, *, host: str = "127.0.0.1", port: int | None = None, status: int = 200
    ) -> None:
        self.requests: list[WebhookRequest] = []
        self.status = status
        self._cond = threading.Condition()

        class Handler(_QuietHandler):
            def do_POST(self) -> None:
                owner: WebhookReceiver = self.server.owner  # type: ignore[attr-defined]
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                req = WebhookRequest(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                with owner._cond:
                    owner.requests.append(req)
                    owner._cond.notify_all()
                self.send_response(owner.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(Handler, host, port)

    def wait_for(
        self, pred: Callable[[WebhookRequest], bool] = lambda r: True, timeout: float = 30
    ) -> WebhookRequest:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for r in self.requests:
                    with contextlib.suppress(Exception):
                        if pred(r):
                            return r
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MonitoringError(
                        f"no matching webhook request in {timeout} s; got {len(self.requests)}"
                    )
                self._cond.wait(left)
