"""adapters/api_writes.py against a loopback HTTP server standing in for the API server's
answers (the real API server is exercised by every cluster test: the operator's writes go
this way): the request as sent, credentials through lightkube's Auth (a rotated token file
re-read on a 401), and errors as lightkube raises them."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from lightkube import ApiError
from lightkube.config.client_adapter import BearerTokenFileAuth

from mtp_operator.adapters.api_writes import APPLY, ApiWrites, object_path
from mtp_operator.adapters.kube import KubeClient, TransportError, urgent_writes

STATUS_409 = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": "the object has been modified",
    "reason": "Conflict",
    "code": 409,
}


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, list[dict], Path]]:
    """A server that answers as the API server would, recording each request; it takes
    only the token now in `token` (so a rotated file is needed after the first write)."""
    seen: list[dict] = []
    token = tmp_path / "token"
    token.write_text("first\n")
    valid = {"Bearer first"}

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append({
            "method": request.method,
            "path": request.path,
            "query": dict(request.query),
            "type": request.headers.get("Content-Type"),
            "auth": request.headers.get("Authorization"),
            "body": json.loads(body) if body else None,
        })
        if request.headers.get("Authorization") not in valid:
            return web.json_response({**STATUS_409, "code": 401, "reason": "Unauthorized",
                                      "message": "Unauthorized"}, status=401)
        if request.path.endswith("/conflict"):
            return web.json_response(STATUS_409, status=409)
        if request.path.endswith("/plain"):
            return web.Response(text="404 page not found", status=404)
        out = json.loads(body)
        out.setdefault("metadata", {})["resourceVersion"] = "7"
        out["metadata"]["managedFields"] = [{"manager": "mtp-operator"}]
        return web.json_response(out)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    seen.append({"valid": valid})
    try:
        yield f"http://127.0.0.1:{port}", seen, token
    finally:
        await runner.cleanup()


def deployment(name: str) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"replicas": 1},
    }


async def test_an_apply_is_sent_as_lightkube_would_and_answers_a_dict(server) -> None:
    url, seen, token = server
    writes = ApiWrites(url, False, BearerTokenFileAuth(str(token)))
    kube = KubeClient(client=None, writes=writes)  # type: ignore[arg-type]
    try:
        out = await kube.apply(deployment("pool"))
        status = await kube.patch_status("ml", "res", {"phase": "Ready"})
    finally:
        await writes.close()
    first, second = seen[1], seen[2]
    assert first["method"] == "PATCH"
    assert first["path"] == "/apis/apps/v1/namespaces/ml/deployments/pool"
    assert first["query"] == {"fieldManager": "mtp-operator", "force": "true"}
    assert first["type"] == APPLY and first["auth"] == "Bearer first"
    assert first["body"] == deployment("pool")
    assert out["metadata"] == {"name": "pool", "namespace": "ml", "resourceVersion": "7"}
    assert second["path"] == "/apis/mtp-operator.io/v1alpha1/namespaces/ml/mtpinferences/res/status"
    assert second["type"] == "application/merge-patch+json"
    assert second["body"] == {"status": {"phase": "Ready"}}
    assert status["status"] == {"phase": "Ready"}


async def test_a_rotated_token_is_read_again_after_a_401(server) -> None:
    url, seen, token = server
    writes = ApiWrites(url, False, BearerTokenFileAuth(str(token)))
    try:
        await writes.request("PATCH", "/api/v1/namespaces/ml/services/a", {"a": 1})
        token.write_text("second\n")  # the kubelet rotates the token; the old one expires
        seen[0]["valid"].clear()
        seen[0]["valid"].add("Bearer second")
        await writes.request("PATCH", "/api/v1/namespaces/ml/services/a", {"a": 2})
    finally:
        await writes.close()
    assert [s["auth"] for s in seen[1:]] == ["Bearer first", "Bearer first", "Bearer second"]


async def test_errors_are_lightkubes(server) -> None:
    url, _, token = server
    writes = ApiWrites(url, False, BearerTokenFileAuth(str(token)))
    try:
        with pytest.raises(ApiError) as err:
            await writes.request("PUT", "/api/v1/namespaces/ml/pods/conflict", {})
        assert err.value.status.code == 409 and err.value.status.reason == "Conflict"
        with pytest.raises(Exception) as plain:  # not a Status: httpx's HTTPStatusError
            await writes.request("PUT", "/api/v1/namespaces/ml/pods/plain", {})
        assert not isinstance(plain.value, ApiError)
        assert plain.value.response.status_code == 404  # type: ignore[attr-defined]
    finally:
        await writes.close()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = ApiWrites(f"http://127.0.0.1:{port}", False, None)
    try:
        with pytest.raises(TransportError):
            await gone.request("PATCH", "/api/v1/namespaces/ml/services/a", {})
    finally:
        await gone.close()


def test_only_the_kinds_it_knows_get_a_path() -> None:
    assert object_path(deployment("p")) == "/apis/apps/v1/namespaces/ml/deployments/p"
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "n"}}
    assert object_path(svc) == "/api/v1/namespaces/n/services/s"
    assert object_path({**svc, "kind": "ConfigMap"}) is None  # lightkube's way instead
    assert object_path({**svc, "metadata": {"name": "s"}}) is None


class Recorder:
    """Stands in for both transports, recording which one each write took."""

    def __init__(self, name: str, took: list[str]) -> None:
        self.name, self.took = name, took

    async def request(self, method: str, *_: object) -> dict:
        self.took.append(f"{self.name} {method}")
        return {"metadata": {"resourceVersion": "1"}}

    async def apply(self, obj: object, **_: object) -> dict:
        self.took.append(f"{self.name} apply")
        return {"metadata": {"resourceVersion": "1"}}

    async def patch(self, *_: object, **__: object) -> dict:
        self.took.append(f"{self.name} patch")
        return {"metadata": {"resourceVersion": "1"}}

    async def create(self, *_: object, **__: object) -> None:
        self.took.append(f"{self.name} create")


async def test_urgent_writes_take_lightkubes_connection() -> None:
    took: list[str] = []
    kube = KubeClient(Recorder("lightkube", took), Recorder("bulk", took))  # type: ignore[arg-type]
    owner = {"metadata": {"name": "res", "namespace": "ml"}}
    await kube.apply(deployment("a"))
    await kube.patch_status("ml", "res", {"phase": "Ready"})
    await kube.event(owner, "PoolCreated", "m")
    assert took == ["bulk PATCH", "bulk PATCH", "bulk POST"]
    took.clear()
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "res-openai", "namespace": "ml"}, "spec": {}}
    with urgent_writes():
        await kube.apply(service)
        await kube.patch_status("ml", "res", {"phase": "Ready"})
        await kube.event(owner, "SpeculationRolledBack", "m")
    await kube.apply(deployment("a"))
    assert took == ["lightkube apply", "lightkube patch", "lightkube create", "bulk PATCH"]
