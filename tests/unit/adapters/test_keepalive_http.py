"""The evaluator's HTTP client (adapters/keepalive_http.py) against servers on loopback: raw
asyncio servers that frame answers each way HTTP/1.1 allows (and break them each way a pod
can), aiohttp's server (Content-Length and chunked) and prometheus_client's own server."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, start_http_server

from mtp_operator.adapters.keepalive_http import HTTPError, KeepAliveClient

pytestmark = pytest.mark.unit

BODY = b"vllm:spec_decode_num_drafts_total 7\n" * 300  # 11 KB, several socket reads


def chunked(body: bytes, size: int, trailer: bytes = b"") -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size])
             for i in range(0, len(body), size)]  # fmt: skip
    return b"".join(parts) + b"0\r\n" + trailer + b"\r\n"


class RawServer:
    """Answers each request with `answer(n)` (n: requests so far on that connection, from 0):
    bytes to send, or None to close without answering; counts connections."""

    def __init__(self, answer, *, drip: int = 0) -> None:
        self.answer = answer
        self.drip = drip  # send the answer this many bytes at a time
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"GET /metrics?x=1 HTTP/1.1\r\n"), head
                out = self.answer(n)
                n += 1
                if out is None:
                    break
                if out == b"hang":
                    await asyncio.sleep(3600)
                step = self.drip or len(out)
                for i in range(0, len(out), step):
                    writer.write(out[i : i + step])
                    await writer.drain()
                    if self.drip:
                        await asyncio.sleep(0)
                if b"Connection: close" in out or b"HTTP/1.0" in out[:9]:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc) -> None:
        for w in self.writers:
            w.close()
        self.server.close()


def with_length(body: bytes = BODY, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def get(client: KeepAliveClient, port: int) -> tuple[int, bytes]:
    return await client.get("127.0.0.1", port, "/metrics?x=1")


async def test_content_length_answers_reuse_one_connection() -> None:
    server = RawServer(lambda n: with_length(BODY + b"%d\n" % n), drip=1000)
    client = KeepAliveClient()
    async with server as port:
        got = [await get(client, port) for _ in range(3)]
        assert got == [(200, BODY + b"%d\n" % n) for n in range(3)]
        assert server.connections == 1 and client.idle() == {("127.0.0.1", port)}
        await client.close()


async def test_chunked_answers_split_anywhere_with_trailers() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    answers = [head + chunked(BODY, 4096), head + chunked(BODY, 333, b"X-Trailer: 1\r\n"),
               head + chunked(b"", 1)]  # fmt: skip
    server = RawServer(lambda n: answers[n], drip=7)  # 7 bytes a write: sizes split too
    client = KeepAliveClient()
    async with server as port:
        assert [await get(client, port) for _ in range(3)] == [(200, BODY)] * 2 + [(200, b"")]
        assert server.connections == 1
        await client.close()


async def test_answers_without_keep_alive_close_their_connection() -> None:
    answers = {
        "HTTP/1.0, body until close": b"HTTP/1.0 200 OK\r\n\r\n" + BODY,
        "Connection: close": with_length(extra=b"Connection: close\r\n"),
        "HTTP/1.0 with length": b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s"
        % (len(BODY), BODY),
    }
    for why, answer in answers.items():
        server = RawServer(lambda n, a=answer: a)
        client = KeepAliveClient()
        async with server as port:
            assert [await get(client, port) for _ in range(2)] == [(200, BODY)] * 2, why
            assert server.connections == 2 and not client.idle(), why


async def test_a_kept_connection_the_server_closed_is_replaced_without_a_failure() -> None:
    # the server's idle time-out meets our request: it closes instead of answering the
    # second request on a connection; the client asks again on a new one
    server = RawServer(lambda n: with_length() if n == 0 else None)
    client = KeepAliveClient()
    async with server as port:
        assert await get(client, port) == (200, BODY)
        assert await get(client, port) == (200, BODY)
        assert server.connections == 2
        # and a server that closed the kept connection while it was idle
        for w in server.writers:
            w.close()
        await asyncio.sleep(0.05)
        assert await get(client, port) == (200, BODY)
        assert server.connections == 3
        await client.close()


async def test_a_new_connection_closed_before_an_answer_fails_once() -> None:
    server = RawServer(lambda n: None)
    client = KeepAliveClient()
    async with server as port:
        with pytest.raises(HTTPError, match="before an answer"):
            await get(client, port)
        assert server.connections == 1  # not asked again: the pod's own failure


@pytest.mark.parametrize(
    "answer, match",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10, "mid-answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "mid-answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", "Content-Length"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "status line"),
    ],
)
async def test_broken_answers_fail_with_the_reason(answer: bytes, match: str) -> None:
    server = RawServer(lambda n: answer)

    async def close_after(reader, writer):  # send the broken answer, then close
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server.handle = close_after  # type: ignore[method-assign]
    client = KeepAliveClient()
    async with server as port:
        with pytest.raises(HTTPError, match=match):
            await get(client, port)
        assert not client.idle()


async def test_refused_and_hanging_pods_fail_within_their_time_outs() -> None:
    client = KeepAliveClient(total_timeout=0.3)
    async with RawServer(lambda n: with_length()) as port:
        pass  # closed again: its port now refuses
    t0 = time.monotonic()
    with pytest.raises(HTTPError, match="cannot connect"):
        await get(client, port)
    async with RawServer(lambda n: b"hang") as hanging:
        with pytest.raises(TimeoutError):
            await get(client, hanging)
        assert time.monotonic() - t0 < 0.3 + 0.5 and not client.idle()


async def test_idle_connections_are_closed_after_idle_seconds() -> None:
    server = RawServer(lambda n: with_length())
    client = KeepAliveClient(idle_seconds=0.1)
    async with server as port:
        await get(client, port)
        await asyncio.sleep(0.15)
        await get(client, port)  # the old one was too old to trust: a new connection
        assert server.connections == 2
        await client.close()
        assert not client.idle()


async def test_aiohttp_server_content_length_and_chunked() -> None:
    async def plain(_request):
        return web.Response(body=BODY)

    async def streamed(_request):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(_request)
        for i in range(0, len(BODY), 1000):
            await resp.write(BODY[i : i + 1000])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/plain", plain)
    app.router.add_get("/streamed", streamed)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = KeepAliveClient()
    try:
        for path in ("/plain", "/streamed", "/plain", "/streamed"):
            assert await client.get("127.0.0.1", port, path) == (200, BODY), path
        assert await client.get("127.0.0.1", port, "/nothing") == (404, b"404: Not Found")
        assert client.idle() == {("127.0.0.1", port)}
    finally:
        await client.close()
        await runner.cleanup()


async def test_prometheus_client_server() -> None:
    reg = CollectorRegistry()
    Counter("vllm:spec_decode_num_drafts", "x", registry=reg).inc(7)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    client = KeepAliveClient()
    try:
        for _ in range(2):
            status, body = await client.get("127.0.0.1", server.server_port, "/metrics")
            assert status == 200 and b"vllm:spec_decode_num_drafts_total 7.0" in body
    finally:
        await client.close()
        server.shutdown()
        thread.join(5)
