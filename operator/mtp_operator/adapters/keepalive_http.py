"""A small keep-alive HTTP/1.1 GET client for many hosts: the built-in
evaluator's scrapes (every pool pod's /metrics, thousands of them every interval).

Why not aiohttp here: the evaluator's CPU budget is a quarter of a core at 4,000 pods
(bench/scale/scale_evaluator.py). Fetching a 55 KB exposition over a kept-alive loopback
connection, spread as the evaluator spreads them, aiohttp's client spent about 0.26 ms of CPU
a fetch and an asyncio.Protocol that frames the answer itself about 0.16 ms (measured on the
bench's machine); at 4,000 pods every 15 s that difference is 0.03 of a core.

What it does: one connection per host, kept after an answer that allows it and reused by the
next GET of that host (mtp-runtime starts vLLM with a keep-alive longer than the evaluator's
interval); bodies framed by Content-Length, by chunked transfer-coding, or by the server
closing the connection; `Connection: close` and HTTP/1.0 answers honoured; a GET on a reused
connection that the server closed before answering is sent again once on a new connection
(the server's idle time-out met our request: not the pod's failure); a connect time-out and a
total time-out per GET; idle connections not used for `idle_seconds` are closed. What it does
not do: TLS, redirects, proxies, compression (it asks for identity), pipelining, cookies.
"""

from __future__ import annotations

import asyncio
import time

MAX_HEAD_BYTES = 64 * 1024  # status line and headers
MAX_BODY_BYTES = 64 * 1024 * 1024


class HTTPError(Exception):
    """The GET failed: no connection, a broken answer, or the connection lost mid-answer."""


class _ClosedBeforeAnswer(HTTPError):
    """The server closed the connection before a byte of the answer came."""


class _Connection(asyncio.Protocol):
    """One connection and the answer in progress on it (one request at a time)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.open = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._reset()

    def _reset(self) -> None:
        self._buf = bytearray()
        self._head_done = False
        self._status = 0
        self._length: int | None = None  # Content-Length
        self._until_close = False  # no framing: the body ends when the server closes
        self._pos = 0  # where the body (or the next chunk) starts in _buf
        self._chunks: list[bytes] = []
        self._chunked_bytes = 0
        self.keep_alive = True

    # ---- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():  # nothing asked: the server is broken
            self.close()
            return
        self._buf += data
        try:
            self._advance()
        except HTTPError as err:
            self._fail(err)

    def eof_received(self) -> bool:
        self.open = False
        return False  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._head_done and self._until_close:
            self._finish(bytes(self._buf[self._pos :]))
        elif not self._buf:
            self._fail(_ClosedBeforeAnswer("connection closed before an answer"))
        else:
            self._fail(HTTPError(f"connection lost mid-answer: {exc or 'closed by the server'}"))

    # ---- one request ----------------------------------------------------------------------
    async def request(self, data: bytes) -> tuple[int, bytes]:
        """Send `data` (a whole request) and wait for the answer: (status, body)."""
        assert self.transport is not None
        self._reset()
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        try:
            return await self._waiter
        finally:  # the answer's bytes are not kept while the connection is idle (55 KB a pod)
            self._waiter = None
            self._buf, self._chunks = bytearray(), []

    def close(self, abort: bool = False) -> None:
        self.open = False
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()

    def _finish(self, body: bytes) -> None:
        assert self._waiter is not None
        if not self._waiter.done():
            self._waiter.set_result((self._status, body))

    def _fail(self, err: HTTPError) -> None:
        self.keep_alive = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(err)
        self.close(abort=True)

    def _advance(self) -> None:
        buf = self._buf
        if not self._head_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise HTTPError("answer head too long")
                return
            self._read_head(bytes(buf[:end]))
            self._pos = end + 4
        if self._until_close:
            if len(buf) - self._pos > MAX_BODY_BYTES:
                raise HTTPError("answer body too long")
            return
        if self._length is not None:
            if len(buf) - self._pos >= self._length:
                if len(buf) - self._pos > self._length:  # bytes past the answer: not reusable
                    self.keep_alive = False
                self._finish(bytes(buf[self._pos : self._pos + self._length]))
            return
        self._advance_chunks()

    def _read_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HTTPError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self._status = int(parts[1])
        connection = b"keep-alive" if parts[0] == b"HTTP/1.1" else b""
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    self._length = int(value.strip())
                except ValueError:
                    raise HTTPError(f"bad Content-Length: {value.strip()[:40]!r}") from None
            elif name == b"transfer-encoding":
                chunked = value.strip().lower().endswith(b"chunked")
            elif name == b"connection":
                connection = value.strip().lower()
        self.keep_alive = connection == b"keep-alive"
        self._head_done = True
        if chunked:
            self._length = None  # chunked wins over a Content-Length (RFC 9112 6.3)
        elif self._length is None:
            if self._status in (204, 304) or 100 <= self._status < 200:
                self._length = 0
            else:
                self._until_close = True
                self.keep_alive = False
        if self._length is not None and self._length > MAX_BODY_BYTES:
            raise HTTPError("answer body too long")

    def _advance_chunks(self) -> None:
        buf = self._buf
        while True:
            eol = buf.find(b"\r\n", self._pos)
            if eol < 0:
                return
            size_field = bytes(buf[self._pos : eol]).split(b";", 1)[0].strip()
            try:
                size = int(size_field, 16)
            except ValueError:
                raise HTTPError(f"bad chunk size: {size_field[:20]!r}") from None
            if size == 0:  # the last chunk, then trailers (if any) and an empty line
                if buf.startswith(b"\r\n", eol + 2):
                    end = eol + 4
                else:
                    t = buf.find(b"\r\n\r\n", eol + 2)
                    if t < 0:
                        return
                    end = t + 4
                if len(buf) > end:
                    self.keep_alive = False
                self._finish(b"".join(self._chunks))
                return
            start = eol + 2
            if len(buf) < start + size + 2:
                return
            self._chunks.append(bytes(buf[start : start + size]))
            self._pos = start + size + 2
            self._chunked_bytes += size
            if self._chunked_bytes > MAX_BODY_BYTES:
                raise HTTPError("answer body too long")


class KeepAliveClient:
    """GETs of `http://<host>:<port><path>`, one kept-alive connection per host and port."""

    def __init__(
        self,
        *,
        connect_timeout: float = 1.0,
        total_timeout: float = 3.0,
        idle_seconds: float = 60.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.total_timeout = total_timeout
        self.idle_seconds = idle_seconds
        extra = {"Accept": "*/*", "User-Agent": "mtp-operator", **(headers or {})}
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in extra.items())
        self._idle: dict[tuple[str, int], _Connection] = {}
        self._swept = time.monotonic()

    async def get(self, host: str, port: int, path: str) -> tuple[int, bytes]:
        """(status, body) of one GET; raises HTTPError or TimeoutError (the whole GET took
        longer than total_timeout, or the connection longer than connect_timeout)."""
        data = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{self._extra}\r\n".encode()
        where = (host, port)
        async with asyncio.timeout(self.total_timeout):
            conn = self._take_idle(where)
            if conn is not None:
                try:
                    return self._done(where, conn, await conn.request(data))
                except _ClosedBeforeAnswer:
                    pass  # the server's idle time-out met this request: once more, anew
                except BaseException:
                    conn.close(abort=True)
                    raise
            conn = await self._connect(where)
            try:
                return self._done(where, conn, await conn.request(data))
            except _ClosedBeforeAnswer as err:
                raise HTTPError(str(err)) from None
            except BaseException:
                conn.close(abort=True)
                raise

    async def __aenter__(self) -> KeepAliveClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for conn in self._idle.values():
            conn.close()
        self._idle.clear()

    def idle(self) -> set[tuple[str, int]]:
        """(host, port) of every idle connection still open."""
        return {w for w, c in self._idle.items() if c.open}

    def _take_idle(self, where: tuple[str, int]) -> _Connection | None:
        now = time.monotonic()
        if now - self._swept > self.idle_seconds:  # hosts no longer asked (pods gone)
            self._swept = now
            for h, c in list(self._idle.items()):
                if now - c.idle_since > self.idle_seconds:
                    c.close()
                    del self._idle[h]
        conn = self._idle.pop(where, None)
        if conn is not None and (not conn.open or now - conn.idle_since > self.idle_seconds):
            conn.close()
            return None
        return conn

    async def _connect(self, where: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(_Connection, *where)
        except OSError as err:
            raise HTTPError(f"cannot connect to {where[0]}:{where[1]}: {err}") from None
        return conn

    def _done(
        self, where: tuple[str, int], conn: _Connection, answer: tuple[int, bytes]
    ) -> tuple[int, bytes]:
        if conn.keep_alive and conn.open:
            conn.idle_since = time.monotonic()
            old = self._idle.pop(where, None)
            if old is not None:  # two GETs of one host at once: keep one connection
                old.close()
            self._idle[where] = conn
        else:
            conn.close()
        return answer
