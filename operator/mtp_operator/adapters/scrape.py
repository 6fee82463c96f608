"""Reading a pool pod's vLLM /metrics over HTTP into spec-decode counters (the built-in
evaluator's scrapes, through the kept-alive connections of `keepalive_http.KeepAliveClient`)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import urlencode

import aiohttp

from mtp_operator.adapters.keepalive_http import HTTPError, KeepAliveClient
from mtp_operator.tuning.counters import PodSample, pod_sample
from mtp_runtime.exposition import ParseError
from mtp_runtime.spec_decode import SPEC_DECODE_COUNTERS, spec_snapshot
from mtp_runtime.vllm_command import DEFAULT_PORT

log = logging.getLogger(__name__)

# Per pod: a pod that does not answer (or accept) in time counts as a failed scrape, so a
# slow or dead pod costs the round one slot for at most this long.
SCRAPE_TIMEOUT_SECONDS = 3.0
CONNECT_TIMEOUT_SECONDS = 1.0
MAX_PARALLEL_SCRAPES = 32
# Only the spec-decode samples, asked as prometheus_client's name[] filter: a plain
# prometheus_client server then answers a few hundred bytes instead of ~55 KB of histograms.
# vLLM (0.32.0, measured by bench/scale/record_exposition.py) ignores it and sends everything;
# spec_snapshot() then skips the other families without parsing them.
METRICS_PATH = "/metrics?" + urlencode([("name[]", n) for n in SPEC_DECODE_COUNTERS])
# Plain text: on a cluster network inflating a gzip answer costs more CPU than it saves.
SCRAPE_HEADERS = {"Accept-Encoding": "identity"}


def metrics_url(ip: str, port: int = DEFAULT_PORT) -> str:
    return f"http://{ip}:{port}{METRICS_PATH}"


def scrape_client(
    *, timeout: float = SCRAPE_TIMEOUT_SECONDS, idle_seconds: float = 60.0
) -> KeepAliveClient:
    """The client scrapes go through (one kept-alive connection a pod); `timeout` per scrape,
    connections idle longer than `idle_seconds` closed."""
    return KeepAliveClient(
        connect_timeout=min(CONNECT_TIMEOUT_SECONDS, timeout),
        total_timeout=timeout,
        idle_seconds=idle_seconds,
        headers=SCRAPE_HEADERS,
    )


async def scrape_pod_timed(
    client: KeepAliveClient, ip: str, sem: asyncio.Semaphore, port: int = DEFAULT_PORT
) -> tuple[Any, float]:
    """The pod's spec-decode snapshot (None when the scrape failed, logged at debug) and the
    seconds the scrape took once it had a slot of `sem`."""
    async with sem:
        t0 = time.monotonic()
        try:
            status, body = await client.get(ip, port, METRICS_PATH)
            if status != 200:
                return None, time.monotonic() - t0
            return spec_snapshot(body.decode("utf-8", "replace")), time.monotonic() - t0
        except (HTTPError, TimeoutError, ParseError) as err:
            log.debug("scrape %s failed: %s", ip, err)
            return None, time.monotonic() - t0


async def scrape_pod(
    client: KeepAliveClient, ip: str, sem: asyncio.Semaphore, port: int = DEFAULT_PORT
) -> Any:
    """The pod's spec-decode snapshot, or None when the scrape failed."""
    return (await scrape_pod_timed(client, ip, sem, port))[0]


async def fetch_pod_sample(
    session: aiohttp.ClientSession, ip: str, sem: asyncio.Semaphore, t: float,
    port: int = DEFAULT_PORT,
) -> PodSample | None:
    """The tuner's scrape: a pod's whole vLLM exposition (spec-decode counters, output tokens,
    engine steps and the running/waiting/KV gauges) as one `PodSample`; None when it failed
    (logged at debug). `session` is an aiohttp.ClientSession made with `tuner_timeout()`."""
    async with sem:
        try:
            async with session.get(f"http://{ip}:{port}/metrics") as resp:
                if resp.status != 200:
                    return None
                return pod_sample(t, await resp.text())
        except (aiohttp.ClientError, TimeoutError, ParseError) as err:
            log.debug("tuning scrape %s failed: %s", ip, err)
            return None


def tuner_timeout() -> aiohttp.ClientTimeout:
    """The tuner session's time-out: the evaluator's per-scrape budget."""
    return aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS)
