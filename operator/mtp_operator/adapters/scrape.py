"""Reading a pool pod's vLLM /metrics over HTTP into spec-decode counters."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from mtp_runtime.exposition import ParseError
from mtp_runtime.spec_decode import spec_snapshot
from mtp_runtime.vllm_command import DEFAULT_PORT

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT = aiohttp.ClientTimeout(total=3)
MAX_PARALLEL_SCRAPES = 32


async def scrape_pod(session: aiohttp.ClientSession, ip: str, sem: asyncio.Semaphore) -> Any:
    async with sem:
        try:
            async with session.get(f"http://{ip}:{DEFAULT_PORT}/metrics") as resp:
                if resp.status != 200:
                    return None
                return spec_snapshot(await resp.text())
        except (aiohttp.ClientError, TimeoutError, ParseError) as err:
            log.debug("scrape %s failed: %s", ip, err)
            return None
