"""Kubernetes I/O: with its write transport (adapters/api_writes.py), the only code that talks to
the API server directly (kopf's watches apart). Async, non-blocking.

Writes are server-side apply with one field manager, so "create or update" is one request
and never a check-then-create race; a 404 on delete means the object is already gone.
Every other API error propagates to the caller (never swallowed).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError, AsyncClient, codecs
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Pod, Service
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from mtp_operator import lws
from mtp_operator.adapters.api_writes import (
    APPLY,
    JSON,
    MERGE_PATCH,
    ApiWrites,
    collection_path,
    object_path,
)
from mtp_operator.api.v1alpha1 import GROUP, KIND, PLURAL, VERSION
from mtp_operator.builders import FIELD_MANAGER
from mtp_operator.events import MESSAGE_LIMIT

log = logging.getLogger(__name__)

try:  # lightkube 1.x talks through httpx2; its connection errors and timeouts are these
    from httpx2 import HTTPStatusError, TransportError
except ImportError:  # pragma: no cover - older lightkube
    from httpx import HTTPStatusError, TransportError

#: What a request to the API server raises besides ApiError when the server is away or slow.
__all__ = ["KubeClient", "TransportError"]

MTPInferenceResource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)
# A resource with traffic classes applies one (mtp_operator.routing); the CRD is the Gateway API
# Inference Extension's, installed by the user.
InferencePoolResource = create_namespaced_resource(
    "inference.networking.k8s.io", "v1", "InferencePool", "inferencepools"
)
# The routing objects a pass may delete when a class leaves the spec (delete_owned).
ROUTING_KINDS: dict[str, Any] = {
    "Service": Service, "ConfigMap": ConfigMap, "InferencePool": InferencePoolResource,
}
# A pool whose replica spans several nodes (mtp_operator.lws); the CRD is sigs.k8s.io/lws's.
LeaderWorkerSetResource = create_namespaced_resource(
    lws.GROUP, lws.API_VERSION.split("/")[1], lws.KIND, lws.PLURAL
)


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `body` without metadata.managedFields: the server-side apply field sets
    (ours and the controllers') are about as large as the spec and nothing here reads them;
    at thousands of pools they were a third of the operator's memory. Shallow: shares the
    rest with `body`."""
    out = dict(body)
    meta = out.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return out


SHARED_STRING_MAX = 64  # strings up to this length are interned by `compact`


def compact(value: Any) -> Any:
    """A deep copy of a parsed JSON value whose dict keys and short strings are interned
    (sys.intern): JSON parsing gives every object its own copy of "terminationMessagePath",
    "IfNotPresent" or a label value, which made about 45% of a pool Deployment kept in
    memory; interned, thousands of pools share one. Equal to `value`."""
    if isinstance(value, dict):
        return {sys.intern(k): compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) <= SHARED_STRING_MAX:
        return sys.intern(value)
    return value


def _to_dict(obj: Any) -> dict[str, Any]:
    """A response as a plain dict, without its managedFields (`slim`): the reconciler keeps
    what a write returned until the watch shows the object."""
    return slim(obj.to_dict() if hasattr(obj, "to_dict") else dict(obj))


# The writes for an alert (its rollback pass and Events) go over lightkube's one HTTP/2
# connection, always open and taking every request at once: over aiohttp's connections they
# queued behind each other (a 5,000-alert body rolls 300 pools) and a burst of them opened
# new connections (TLS handshakes on both ends while the burst waits). Set by the control
# layer (control/rollback.py) with `urgent_writes`.
_URGENT: contextvars.ContextVar[bool] = contextvars.ContextVar("mtp_urgent", default=False)


@contextlib.contextmanager
def urgent_writes() -> Iterator[None]:
    """Within this block (and the tasks it starts), writes skip the bulk transport."""
    token = _URGENT.set(True)
    try:
        yield
    finally:
        _URGENT.reset(token)


def writes_are_urgent() -> bool:
    """Whether the code running now is inside `urgent_writes`."""
    return _URGENT.get()


def _answer(out: dict[str, Any]) -> Any:
    """A write's answer as the reconciler keeps it (until the watch shows the object): without
    managedFields, its keys and short strings shared (`compact`: 8.6 KiB against 15.5 for
    a pool Deployment parsed afresh)."""
    return compact(slim(out))


class KubeClient:
    """control.ports.Kube over a lightkube AsyncClient; the writes of a rollout (applies,
    replaces, status patches, Events) over `writes` (adapters/api_writes.py: the same
    server and credentials, a third of the CPU a request) when given."""

    def __init__(self, client: AsyncClient, writes: ApiWrites | None = None) -> None:
        self.client = client
        self.writes = writes

    def _bulk(self) -> ApiWrites | None:
        """The bulk transport, unless the writes under way are urgent."""
        return None if writes_are_urgent() else self.writes

    async def _bulk_object(
        self, method: str, obj: Mapping[str, Any], content_type: str, params: Mapping[str, str]
    ) -> dict[str, Any] | None:
        """`obj` written over the bulk transport, its answer; None when the write does not
        go that way (urgent writes, no bulk transport, a kind api_writes has no path for)."""
        bulk = self._bulk()
        path = object_path(obj) if bulk is not None else None
        if bulk is None or path is None:
            return None
        return _answer(await bulk.request(method, path, obj, content_type, params))

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or update `obj` by server-side apply (force: the operator owns these fields)."""
        params = {"fieldManager": FIELD_MANAGER, "force": "true"}
        if (out := await self._bulk_object("PATCH", obj, APPLY, params)) is not None:
            return out
        res = codecs.from_dict(dict(obj))
        out = await self.client.apply(res, field_manager=FIELD_MANAGER, force=True)
        return _to_dict(out)

    async def replace(self, obj: Mapping[str, Any], resource_version: str | None) -> dict:
        """Replace `obj` as a whole (PUT): fields someone else added go, which server-side
        apply never removes (they belong to that other field manager). Conditional on
        `resource_version`: a concurrent change is a 409, retried by the caller."""
        body = dict(obj)
        body["metadata"] = {**obj["metadata"], "resourceVersion": resource_version}
        params = {"fieldManager": FIELD_MANAGER}
        if (out := await self._bulk_object("PUT", body, JSON, params)) is not None:
            return out
        out = await self.client.replace(codecs.from_dict(body), field_manager=FIELD_MANAGER)
        return _to_dict(out)

    async def crd_served(self, namespace: str | None = None) -> bool:
        """Whether the API server serves MTPInference (the CRD is installed): one list of at
        most one object, in `namespace` or cluster-wide; a 404 means it is not (the server
        answers a resource it does not know with a plain-text 404, not a Status)."""
        try:
            async for _ in self.client.list(
                MTPInferenceResource, namespace=namespace or "*", chunk_size=1
            ):
                break
        except ApiError as err:
            if err.status.code == 404:
                return False
            raise
        except HTTPStatusError as err:
            if err.response.status_code == 404:
                return False
            raise
        return True

    async def namespace_labels(self, name: str) -> dict[str, str] | None:
        """A Namespace's labels (one GET; `namespaces get`); None when there is no such
        namespace."""
        try:
            obj = await self.client.get(Namespace, name)
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise
        return dict((obj.metadata.labels if obj.metadata else None) or {})

    async def _delete(self, resource: Any, namespace: str, name: str) -> None:
        """Delete one object; one already gone (404) is not an error."""
        try:
            await self.client.delete(resource, name, namespace=namespace)
        except ApiError as err:
            if err.status.code != 404:
                raise

    async def delete_deployment(self, namespace: str, name: str) -> None:
        await self._delete(Deployment, namespace, name)

    async def delete_leaderworkerset(self, namespace: str, name: str) -> None:
        await self._delete(LeaderWorkerSetResource, namespace, name)

    async def delete_pdb(self, namespace: str, name: str) -> None:
        await self._delete(PodDisruptionBudget, namespace, name)

    async def delete_pod(self, namespace: str, name: str) -> None:
        await self._delete(Pod, namespace, name)

    async def delete_owned(self, kind: str, namespace: str, name: str, owner_uid: str) -> bool:
        """Read the object, then delete it only if its controller is `owner_uid` (a routing
        object of a traffic class no longer in the spec, issue 39)."""
        res = ROUTING_KINDS[kind]
        try:
            obj = await self.client.get(res, name, namespace=namespace)
            refs = (_to_dict(obj).get("metadata") or {}).get("ownerReferences") or ()
            if not any(r.get("controller") is True and r.get("uid") == owner_uid for r in refs):
                log.warning("%s %s/%s not deleted: not controlled by the MTPInference %s",
                            kind, namespace, name, owner_uid)
                return False
            await self.client.delete(res, name, namespace=namespace)
        except ApiError as err:
            if err.status.code != 404:
                raise
            return False
        return True

    async def patch_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the status subresource; returns the updated object."""
        bulk = self._bulk()
        if bulk is not None:
            path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
            patch = {"status": dict(status)}
            return _answer(await bulk.request("PATCH", path, patch, MERGE_PATCH))
        out = await self.client.patch(
            MTPInferenceResource.Status,
            name,
            {"status": dict(status)},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
        return _to_dict(out)

    async def event(
        self,
        involved: Mapping[str, Any],
        reason: str,
        message: str,
        type_: str = "Normal",
    ) -> None:
        """Post a core/v1 Event about `involved` (an object body). Failures are logged only:
        an Event is a notification, and losing one must not undo the work it reports."""
        meta = involved.get("metadata") or {}
        now = datetime.now(UTC)
        event = Event(
            metadata=ObjectMeta(
                generateName=f"{meta.get('name', 'mtpi')}.", namespace=meta.get("namespace")
            ),
            involvedObject=ObjectReference(
                apiVersion=involved.get("apiVersion", f"{GROUP}/{VERSION}"),
                kind=involved.get("kind", KIND),
                name=meta.get("name"),
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
                resourceVersion=meta.get("resourceVersion"),
            ),
            reason=reason,
            message=message[:MESSAGE_LIMIT],
            type=type_,
            source=EventSource(component="mtp-operator"),
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
            reportingComponent="mtp-operator",
            reportingInstance="mtp-operator",
        )
        try:
            bulk = self._bulk()
            if bulk is not None:
                path = collection_path("v1", "events", meta.get("namespace") or "default")
                await bulk.request("POST", path, event.to_dict())
            else:
                await self.client.create(event, namespace=meta.get("namespace"))
        except ApiError as err:
            log.warning("could not post event %s for %s: %s", reason, meta.get("name"), err)
