"""Loopback metric sources for the evaluator benchmark (bench/scale/scale_evaluator.py).

One process serves a recorded vLLM exposition (`--template`, a real engine's /metrics) on
thousands of pod IPs at vLLM's port, one listening socket per IP, with live spec-decode
counters: every other line is served as recorded, so each answer has the real engine's size
and shape. Like vLLM it sends the whole exposition whatever is asked; with `honour_names` in
its config it answers only the sample names given as `name[]` (as a plain prometheus_client
server does). It gzips when the client accepts it, and frames each answer in one chunk as
vLLM's uvicorn does.

Counters of pod i at time t (closed form, so the benchmark knows the exact crossing time):
drafts D = rate·(t - start); draft tokens = K·D; accepted at position j
c_j = p^(j+1)·rate·(min(t, degrade_i) - start); accepted = Σ c_j. A pod with a degrade time
stops accepting at that moment.

Connections idle for --keepalive-seconds are closed (vLLM's API server, uvicorn, keeps an
idle connection 5 s: VLLM_HTTP_TIMEOUT_KEEP_ALIVE), so a scraper reading every 15 s opens a
new connection for each read, as against a real engine.

Pod kinds: `ok`; `dead` (no socket on its IP: connection refused); `hang` (accepts, never
answers); `slow` (answers after --slow-seconds).

    python bench/scale/scale_sources.py --config sources.json    # prints "ready <n>" when bound
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

SPEC = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": "per_pos",
}


@dataclass
class Line:
    text: bytes  # the recorded line, with its newline
    family: str  # the family it belongs to (from the TYPE/HELP line before it)
    sample: str | None = None  # sample name, for sample lines
    slot: str | None = None  # SPEC value for a live spec-decode sample
    position: int = 0
    prefix: bytes = b""  # the line up to its value, for live lines


def load_template(path: Path) -> tuple[list[Line], int]:
    """The recorded exposition's lines, and K (the number of draft positions in it)."""
    lines: list[Line] = []
    family = ""
    k = 0
    for raw in path.read_text().splitlines():
        if raw.startswith("#"):
            parts = raw.split(None, 3)
            if len(parts) >= 3:
                family = parts[2]
            lines.append(Line((raw + "\n").encode(), family))
            continue
        name = raw.split("{", 1)[0].split(" ", 1)[0]
        line = Line((raw + "\n").encode(), family, sample=name)
        if name in SPEC:
            line.slot = SPEC[name]
            line.prefix = raw.rsplit(" ", 1)[0].encode() + b" "
            if line.slot == "per_pos":
                line.position = int(raw.split('position="', 1)[1].split('"', 1)[0])
                k = max(k, line.position + 1)
        lines.append(line)
    if k == 0:
        raise SystemExit(f"{path}: no vllm:spec_decode_num_accepted_tokens_per_pos_total samples")
    return lines, k


def counters(t: float, start: float, rate: float, p: float, k: int, degrade: float | None):
    d = rate * max(t - start, 0.0)
    good = rate * max(min(t, degrade if degrade is not None else t) - start, 0.0)
    per = [math.floor(good * p ** (j + 1)) for j in range(k)]
    return {"drafts": math.floor(d), "draft_tokens": k * math.floor(d),
            "accepted": sum(per), "per_pos": per}  # fmt: skip


def segments(lines: list[Line], names: frozenset[str] | None) -> list[bytes | Line]:
    """The exposition as static byte runs and live lines; with `names`, only those samples'
    families (their HELP/TYPE lines and the samples named), as prometheus_client's
    restricted registry answers."""
    keep = None if names is None else {ln.family for ln in lines if ln.sample in names}
    out: list[bytes | Line] = []
    run: list[bytes] = []
    for ln in lines:
        if keep is not None:
            if ln.family not in keep or (ln.sample is not None and ln.sample not in names):
                continue
        if ln.slot is None:
            run.append(ln.text)
            continue
        if run:
            out.append(b"".join(run))
            run = []
        out.append(ln)
    if run:
        out.append(b"".join(run))
    return out


def render(parts: list[bytes | Line], values: dict[str, Any]) -> bytes:
    out = []
    for part in parts:
        if isinstance(part, bytes):
            out.append(part)
        else:
            v = values[part.slot][part.position] if part.slot == "per_pos" else values[part.slot]
            out.append(part.prefix + f"{float(v)!r}\n".encode())
    return b"".join(out)


class Sources:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.lines, self.k = load_template(Path(cfg["template"]))
        self.pods: dict[str, dict[str, Any]] = {p["ip"]: p for p in cfg["pods"]}
        self.served = 0
        self._parts: dict[frozenset[str] | None, list[bytes | Line]] = {}

    def answer(self, ip: str, head: bytes) -> bytes:
        pod = self.pods[ip]
        request_line, _, rest = head.partition(b"\r\n")
        target = request_line.split(b" ")[1].decode()
        url = urlsplit(target)
        if url.path != "/metrics":
            return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
        names = None
        if self.cfg.get("honour_names"):
            asked = parse_qs(url.query).get("name[]")
            names = frozenset(asked) if asked else None
        values = counters(time.time(), self.cfg["start"], self.cfg["rate"], self.cfg["p"],
                          self.k, pod.get("degrade"))  # fmt: skip
        parts = self._parts.get(names)
        if parts is None:
            parts = self._parts[names] = segments(self.lines, names)
        body = render(parts, values)
        headers = [b"HTTP/1.1 200 OK",
                   b"Content-Type: text/plain; version=0.0.4; charset=utf-8"]  # fmt: skip
        if b"gzip" in rest.lower().split(b"accept-encoding:", 1)[-1].split(b"\r\n", 1)[0]:
            body = gzip.compress(body)
            headers.append(b"Content-Encoding: gzip")
        # framed as vLLM's server frames it: uvicorn sends prometheus_client's answer (no
        # Content-Length) as one chunk and the last chunk (seen with uvicorn 0.55, h11 and
        # httptools alike)
        headers.append(b"Transfer-Encoding: chunked")
        self.served += 1
        return (b"\r\n".join(headers) + b"\r\n\r\n%x\r\n" % len(body) + body
                + b"\r\n0\r\n\r\n")  # fmt: skip


class Conn(asyncio.Protocol):
    def __init__(self, sources: Sources, ip: str) -> None:
        self.sources, self.ip, self.buf = sources, ip, b""
        self.kind = sources.pods[ip].get("kind", "ok")
        self.transport: asyncio.Transport | None = None

    idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.idle is not None:
            self.idle.cancel()

    def _arm(self) -> None:
        """Close the connection after keepalive_seconds without a request."""
        if self.idle is not None:
            self.idle.cancel()
        seconds = self.sources.cfg.get("keepalive_seconds")
        if seconds and self.kind != "hang":
            self.idle = asyncio.get_running_loop().call_later(seconds, self._close)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._arm()
        while b"\r\n\r\n" in self.buf:
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            if self.kind == "hang":
                continue  # never answers; the client's time-out ends it
            reply = self.sources.answer(self.ip, head)
            if self.kind == "slow":
                asyncio.get_running_loop().call_later(
                    self.sources.cfg["slow_seconds"], self._send, reply)
            else:
                self._send(reply)

    def _send(self, reply: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(reply)
            self._arm()  # idle from the answer on


async def serve(cfg: dict[str, Any]) -> None:
    sources = Sources(cfg)
    loop = asyncio.get_running_loop()
    servers = []
    for ip, pod in sources.pods.items():
        if pod.get("kind") == "dead":
            continue
        servers.append(await loop.create_server(
            lambda ip=ip: Conn(sources, ip), host=ip, port=cfg["port"],
            reuse_address=True, backlog=64))  # fmt: skip
    print(f"ready {len(servers)}", flush=True)
    stop = asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), stop.set)  # the parent closes stdin to stop us
    await stop.wait()
    print(f"served {sources.served}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, required=True)
    cfg = json.loads(p.parse_args().config.read_text())
    asyncio.run(serve(cfg))


if __name__ == "__main__":
    main()
