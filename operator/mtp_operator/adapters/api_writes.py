"""The operator's writes to the API server over aiohttp: plain dicts in, plain dicts out.

A rollout of N resources makes ~7N writes (a server-side apply per pool Deployment and
Service, status patches, Events). Through lightkube's httpx client each cost ~1.1-1.2 ms of
the operator's CPU (HTTP/2 or HTTP/1.1 alike; lightkube's own models a small part of it),
through aiohttp's keep-alive connections ~0.37 ms (the same server-side apply of a 5 KB
object, 32 in flight, against this sandbox's kube-apiserver). The writes take the server,
TLS settings and credentials from the same lightkube configuration as the client used for
everything else, and the credentials through its httpx `Auth` (a static token, a token file
re-read on a 401 as the kubelet rotates it, an exec plugin), so both authenticate alike.

Errors are those of lightkube, so callers handle one kind: an API error answer raises
`lightkube.ApiError` (its `status` parsed from the server's Status), any other error answer
httpx's `HTTPStatusError`, and a connection that fails or times out httpx's `TransportError`.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import aiohttp
from lightkube import ApiError

try:  # lightkube 1.x talks through httpx2
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older lightkube
    import httpx  # type: ignore[no-redef]

# Connections to the API server, kept open: room for a turn of pool writes
# (control/pool_writes.BULK_WRITES_IN_FLIGHT) beside the passes' status patches and Events.
# With 16 a 1,000-resource rollout took 1.37x and 1.26x the floor in two rounds, with 64
# 1.14x and 1.13x in two runs of three rounds (bench/results/rollout-1000-2026-12-04-*).
# An alert's writes do not come here (adapters/kube.urgent_writes), so a wave of them opens
# no connections.
CONNECTIONS = 64
TIMEOUT_SECONDS = 10.0  # as lightkube's default, for connecting and for each read
KEEPALIVE_SECONDS = 60.0

APPLY = "application/apply-patch+yaml"  # JSON is YAML
MERGE_PATCH = "application/merge-patch+json"
JSON = "application/json"


class ApiWrites:
    """Requests with a JSON body to one API server; one aiohttp session, made on first use
    (inside the running event loop) and closed by `close`."""

    def __init__(
        self,
        server: str,
        ssl_context: ssl.SSLContext | bool,
        auth: httpx.Auth | None,
        connections: int = CONNECTIONS,
        timeout: float = TIMEOUT_SECONDS,
    ) -> None:
        self.server = server.rstrip("/")
        self.ssl = ssl_context
        self.auth = auth
        self.connections = connections
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_config(cls, config: Any) -> ApiWrites:
        """From a lightkube SingleConfig (`KubeConfig.from_env().get()`), as lightkube's own
        client is built from it."""
        from lightkube.config import client_adapter

        verify = client_adapter.verify_cluster(config.cluster, config.user, config.abs_file)
        return cls(config.cluster.server, verify, client_adapter.user_auth(config.user))

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self.ssl if isinstance(self.ssl, ssl.SSLContext) else bool(self.ssl),
                limit=self.connections,
                keepalive_timeout=KEEPALIVE_SECONDS,
            )
            timeout = aiohttp.ClientTimeout(sock_connect=self.timeout, sock_read=self.timeout)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any],
        content_type: str = JSON,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """`method` `path` with `body` as JSON; the answer's JSON object."""
        url = self.server + path + (f"?{urlencode(params)}" if params else "")
        data = json.dumps(body, separators=(",", ":")).encode()
        probe = httpx.Request(method, url)  # what the credentials are written into
        flow = self.auth.async_auth_flow(probe) if self.auth is not None else None
        if flow is not None:
            probe = await flow.__anext__()
        while True:
            headers = {"Content-Type": content_type, "Accept": JSON}
            if "authorization" in probe.headers:
                headers["Authorization"] = probe.headers["authorization"]
            status, ctype, raw = await self._send(method, url, data, headers)
            if status == 401 and flow is not None:  # a rotated token: the Auth tries again
                try:
                    probe = await flow.asend(httpx.Response(status, request=probe))
                    continue
                except StopAsyncIteration:
                    pass
            break
        if flow is not None:
            await flow.aclose()
        if status >= 400:
            answer = httpx.Response(
                status, content=raw, headers={"Content-Type": ctype}, request=probe
            )
            if ctype.startswith(JSON):
                raise ApiError(request=probe, response=answer)
            answer.raise_for_status()
        return json.loads(raw) if raw else {}

    async def _send(
        self, method: str, url: str, data: bytes, headers: Mapping[str, str]
    ) -> tuple[int, str, bytes]:
        try:
            async with self._client().request(method, url, data=data, headers=headers) as r:
                return r.status, r.headers.get("Content-Type", ""), await r.read()
        except TimeoutError as err:
            raise httpx.ReadTimeout(f"{method} {url}: timed out") from err
        except (aiohttp.ClientError, OSError) as err:
            raise httpx.ConnectError(f"{method} {url}: {type(err).__name__}: {err}") from err


# The kinds the operator writes by server-side apply or replace: (apiVersion, kind) -> plural
PLURALS = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
}


def collection_path(api_version: str, plural: str, namespace: str) -> str:
    """The URL path of a namespaced collection (`/api/v1/...` for the core group)."""
    root = "/api/" if "/" not in api_version else "/apis/"
    return f"{root}{api_version}/namespaces/{namespace}/{plural}"


def object_path(obj: Mapping[str, Any]) -> str | None:
    """The URL path of `obj` (a namespaced object of a kind in PLURALS); None for another."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    plural = PLURALS.get((api_version, kind))
    meta = obj.get("metadata") or {}
    if plural is None or not meta.get("namespace") or not meta.get("name"):
        return None
    return f"{collection_path(api_version, plural, meta['namespace'])}/{meta['name']}"
