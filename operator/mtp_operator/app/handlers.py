"""Thin kopf handlers: they keep in-memory views of the cluster and ask the reconciler to act.

Only watch-event handlers and indexes are used (no kopf timers or daemons, which would add
finalizers): kopf writes no progress annotations or finalizers, so the operator never edits
the user's objects (GitOps sees no drift, and deleting a resource never waits for the
operator), and a steady state makes no writes at all. The periodic resync is `resync_loop`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from mtp_operator import lws
from mtp_operator.adapters.kube import compact, slim
from mtp_operator.api.v1alpha1 import GROUP, KIND, PLURAL, VERSION
from mtp_operator.control.reconciler import Key, Reconciler, product_of
from mtp_operator.naming import (
    LABEL_CANARY,
    LABEL_GPU_PRODUCT,
    LABEL_MANAGED_BY,
    LABEL_POD_TEMPLATE_HASH,
    LABEL_RESOURCE,
    LABEL_TRAFFIC_CLASS,
    MANAGED_BY,
    controller_ref,
    label_value,
    pool_deployment_name,
    pool_key,
    pool_member,
    service_name,
    split_pool_key,
)
from mtp_operator.planning import GPUNode, gpu_node_from_body
from mtp_operator.settings import DEFAULT_LIST_PAGE_SIZE

log = logging.getLogger(__name__)

OWNED = {LABEL_MANAGED_BY: MANAGED_BY}
DEPLOYMENT_KIND = ("apps", "v1", "deployments")
# multi-node pools (mtp_operator.lws); without the LWS CRD kopf serves no watch for it (a
# CRD installed after the operator started is watched from its next start)
LWS_KIND = (lws.GROUP, lws.API_VERSION.split("/")[1], lws.PLURAL)
SERVICE_KIND = ("v1", "services")
POD_KIND = ("v1", "pods")
# the kinds watched only for objects we made (server-side label selector, see configure)
WATCHED_OWNED = (DEPLOYMENT_KIND, LWS_KIND, SERVICE_KIND, POD_KIND)
# kinds whose listed objects need no handler while the start-up is under way, so they need
# not wait at kopf's start-up gate (kopf_tweaks.index_only_kinds_skip_the_gate): a listed
# pool Deployment is indexed, and its resource's own listed event passes it once the gate opens
LISTED_WITHOUT_THE_GATE = (DEPLOYMENT_KIND, LWS_KIND)
RUNNING_PODS = "status.phase=Running"
RESYNC_SECONDS = 30.0
# How long kopf keeps an object's worker (a task, its queue, the last event) after its last
# event: kopf's 5 s kept thousands alive through a rollout at 1,000 resources; a new event
# after this starts a new worker, which is cheap next to the event's processing.
WORKER_IDLE_SECONDS = 1.0


def owner_key(body: Mapping[str, Any]) -> Key | None:
    meta = body.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/"):
            return (meta.get("namespace", ""), ref.get("name", ""))
    return None


# What the pod index reads of a pod; kopf itself reads metadata only (index handlers get no
# diff). The rest of a pod (its spec and container statuses, ~90% of it) is dropped where the
# watch event arrives (kopf_tweaks.slim_watch_events): kopf holds each event until the pod's
# worker has run, and at start-up that is every pool pod at once.
POD_STATUS_READ = ("phase", "conditions", "podIP")


def pod_for_index(body: Mapping[str, Any]) -> dict[str, Any]:
    """A pod as the operator keeps it: identity, metadata and POD_STATUS_READ."""
    status = body.get("status") or {}
    return {
        "apiVersion": body.get("apiVersion", "v1"),
        "kind": body.get("kind", "Pod"),
        "metadata": body.get("metadata") or {},
        "status": {k: status[k] for k in POD_STATUS_READ if k in status},
    }


def pod_index_entry(body: Mapping[str, Any]) -> dict:
    """{(namespace, resource, product): (pod name, pod IP)} for a ready pool pod with an IP;
    {} for any other pod (kopf drops an earlier entry of the same pod)."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = body.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if not ready or not status.get("podIP") or LABEL_GPU_PRODUCT not in labels:
        return {}
    pool = labels[LABEL_GPU_PRODUCT]  # a class pool's pods: `product/class` (naming.pool_key)
    if labels.get(LABEL_TRAFFIC_CLASS):
        pool = pool_key(pool, labels[LABEL_TRAFFIC_CLASS])
    key = (meta.get("namespace"), labels.get(LABEL_RESOURCE), pool)
    return {key: (meta.get("name"), status["podIP"], membership_meta(meta))}


def membership_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What naming.pool_member reads of a pod: its controller reference and two labels."""
    labels = meta.get("labels") or {}
    ref = controller_ref(meta)
    return {
        "labels": {k: labels[k] for k in (LABEL_CANARY, LABEL_POD_TEMPLATE_HASH) if k in labels},
        "ownerReferences": [dict(ref)] if ref is not None else [],
    }


def _pod_kept(body: dict[str, Any]) -> Any:
    return compact(pod_for_index(body))


# Per watched kind (group, version, plural): what of its objects the operator keeps, applied
# where kopf's watch stream yields each event. Pool Deployments are kept whole (drift reads
# all of the spec) but compact: their keys and short strings shared between pools.
WATCH_PROJECTIONS = {
    ("", POD_KIND[0], POD_KIND[1]): _pod_kept,
    DEPLOYMENT_KIND: compact,
    LWS_KIND: compact,
}


class KopfView:
    """The reconciler's ClusterView over kopf's indexes (bound on the first handler call)."""

    def __init__(self) -> None:
        self.resources: Any = None
        self.nodes: Any = None
        self.deployments: Any = None
        self.leaderworkersets: Any = None
        self.services: Any = None
        self.pods: Any = None
        self.canaries: Any = None
        self.claims: Any = None

    @property
    def ready(self) -> bool:
        """True once kopf has called a handler: kopf holds every handler back until every
        watched kind is fully listed and indexed, so this is "the first full index is done"."""
        return self.resources is not None

    def reset(self) -> None:
        """Forget the bound indexes (kopf restarts with new ones after a CRD re-install)."""
        self.__init__()  # type: ignore[misc]

    def bind(self, kwargs: Mapping[str, Any]) -> None:
        if self.resources is None:
            self.resources = kwargs["mtpi_index"]
            self.nodes = kwargs["gpu_node_index"]
            self.deployments = kwargs["pool_deployment_index"]
            self.leaderworkersets = kwargs["pool_lws_index"]
            self.services = kwargs["service_index"]
            self.pods = kwargs["pool_pod_index"]
            self.canaries = kwargs["canary_pod_index"]
            self.claims = kwargs["claim_index"]

    def resource(self, key: Key) -> Mapping[str, Any] | None:
        for body in self.resources.get(key, ()):
            return body
        return None

    def resource_keys(self) -> Iterable[Key]:
        return list(self.resources.keys())

    def gpu_nodes(self) -> Iterable[GPUNode]:
        return [node for store in self.nodes.values() for node in store]

    def pool_deployments(self, key: Key) -> Mapping[str, Mapping[str, Any]]:
        """Pool Deployments and LeaderWorkerSets by pool key (while a pool changes kind
        both may be shown for a moment: the LeaderWorkerSet is the one returned)."""
        out = {}
        for index in (self.deployments, self.leaderworkersets):
            for body in index.get(key, ()):
                product = product_of(body)
                if product:
                    out[product] = body
        return out

    def pool_pod_ips(self, key: Key, product: str) -> dict[str, str]:
        """Ready pods of one pool (`product`: its pool key): {pod name: pod IP}. Only pods
        the pool owns (naming.pool_member: its Deployment's ReplicaSets, or a canary of the
        resource by UID); one carrying the pool's labels alone is not scraped (issue 36)."""
        gpu, traffic_class = split_pool_key(product)
        index_key = (key[0], label_value(key[1]), pool_key(label_value(gpu), traffic_class))
        body = self.resource(key)
        uid = ((body or {}).get("metadata") or {}).get("uid") or ""
        deployment = pool_deployment_name(key[1], gpu, traffic_class)
        return {
            name: ip
            for name, ip, meta in self.pods.get(index_key, ())
            if pool_member(meta, uid, deployment)
        }

    def has_service(self, key: Key) -> bool:
        return bool(list(self.services.get(key, ())))

    def service_selector(self, key: Key) -> Mapping[str, str] | None:
        """The selector of the resource's own Service as the watch shows it (None: not shown)."""
        name = service_name(key[1])
        for svc_name, selector in self.services.get(key, ()):
            if svc_name == name:
                return selector
        return None

    def class_services(self, key: Key) -> Mapping[str, str]:
        """The resource's class Services as the watch shows them: {name: class}."""
        return {
            svc_name: selector[LABEL_TRAFFIC_CLASS]
            for svc_name, selector in self.services.get(key, ())
            if selector.get(LABEL_TRAFFIC_CLASS)
        }

    def canary_pods(self, key: Key) -> Mapping[str, Mapping[str, Any]]:
        """The resource's tuning canary pods (Running): {pod name: its metadata}."""
        return {meta.get("name", ""): meta for meta in self.canaries.get(key, ())}

    def has_claim(self, namespace: str, name: str) -> bool:
        """A PersistentVolumeClaim exists (spec.modelCache.persistentVolumeClaim)."""
        return bool(list(self.claims.get((namespace, name), ())))


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler, view: KopfView) -> None:
    """Register every handler on `registry`, bound to `reconciler`."""
    mtpi = (GROUP, VERSION, PLURAL)

    @kopf.index(*mtpi, id="mtpi_index", registry=registry)
    async def mtpi_index(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict:
        return {(namespace, name): slim(body)}

    # Index functions are coroutines: kopf runs a plain function in its thread pool, one
    # hand-over per watch event (tens of thousands in a large rollout) for a few dict lookups.
    # Every index returns {} (never None) for an object that no longer qualifies: kopf keeps
    # an object's previous entry when its index function returns None, so a node whose GPU
    # label was removed would stay a node of that product forever.
    @kopf.index("v1", "nodes", id="gpu_node_index", registry=registry)
    async def gpu_node_index(body: kopf.Body, **_: Any) -> dict:
        node = gpu_node_from_body(body)
        return {node.product: node} if node else {}

    @kopf.index(
        *DEPLOYMENT_KIND, labels=OWNED, id="pool_deployment_index", registry=registry
    )
    async def pool_deployment_index(body: kopf.Body, **_: Any) -> dict:
        key = owner_key(body)
        return {key: slim(body)} if key else {}

    @kopf.index(*LWS_KIND, labels=OWNED, id="pool_lws_index", registry=registry)
    async def pool_lws_index(body: kopf.Body, **_: Any) -> dict:
        key = owner_key(body)
        return {key: slim(body)} if key else {}

    @kopf.index(*SERVICE_KIND, labels=OWNED, id="service_index", registry=registry)
    async def service_index(body: kopf.Body, **_: Any) -> dict:
        key = owner_key(body)
        if not key:
            return {}
        selector = dict((body.get("spec") or {}).get("selector") or {})
        return {key: ((body.get("metadata") or {}).get("name", ""), selector)}

    @kopf.index(*POD_KIND, labels=OWNED, id="pool_pod_index", registry=registry)
    async def pool_pod_index(body: kopf.Body, **_: Any) -> dict:
        return pod_index_entry(body)

    # tuning canaries by their resource, Ready or not: a pass deletes one no live trial names
    # and makes again one that went away (control/writes.py, issue 36)
    @kopf.index(*POD_KIND, labels={**OWNED, LABEL_CANARY: "true"}, id="canary_pod_index",
                registry=registry)
    async def canary_pod_index(body: kopf.Body, **_: Any) -> dict:
        key = owner_key(body)
        return {key: dict(body.get("metadata") or {})} if key else {}

    @kopf.index("v1", "persistentvolumeclaims", id="claim_index", registry=registry)
    async def claim_index(namespace: str, name: str, **_: Any) -> dict:
        return {(namespace, name): True}

    @kopf.on.event(*mtpi, registry=registry)
    async def resource_changed(
        event: dict, namespace: str, name: str, body: kopf.Body, **kw: Any
    ) -> None:
        view.bind(kw)
        if event.get("type") == "DELETED":
            reconciler.forget((namespace, name))
            return
        # our own status write coming back, or a version a pass already read: nothing new
        if reconciler.own_status_echo((namespace, name), body):
            return
        if not reconciler.resource_news((namespace, name), body):
            return
        await reconciler.reconcile_or_retry((namespace, name))

    @kopf.on.event("v1", "nodes", registry=registry)
    async def node_changed(**kw: Any) -> None:
        view.bind(kw)
        if reconciler.gpu_inventory_changed():
            await reconciler.reconcile_for_nodes()

    @kopf.on.event(*LWS_KIND, labels=OWNED, registry=registry)
    @kopf.on.event(*DEPLOYMENT_KIND, labels=OWNED, registry=registry)
    async def pool_changed(event: dict, body: kopf.Body, **kw: Any) -> None:
        if event.get("type") is None and not view.ready:
            return  # listed at start-up, maybe before the gate (LISTED_WITHOUT_THE_GATE)
        view.bind(kw)
        key = owner_key(body)
        if key:
            reconciler.pool_seen(key, body)
            # a version the last pass of its resource already saw brings nothing new
            if event.get("type") == "DELETED" or reconciler.pool_news(key, body):
                await reconciler.reconcile_or_retry(key)


    @kopf.on.event("v1", "persistentvolumeclaims", registry=registry)
    async def claim_changed(event: dict, namespace: str, **kw: Any) -> None:
        # a model cache's claim appeared or went away: its resources are checked again
        view.bind(kw)
        if event.get("type") in ("ADDED", "DELETED", None):
            keys = [k for k in view.resource_keys() if k[0] == namespace]
            await asyncio.gather(*(reconciler.reconcile_or_retry(k) for k in keys))


async def resync_loop(reconciler: Reconciler, view: KopfView, interval: float) -> None:
    """Reconcile everything every `interval` seconds: retries after API errors and lets
    time-based rollback state (known-good promotion) advance. Unchanged objects cost no
    API request."""
    while True:
        await asyncio.sleep(interval)
        if view.ready:
            await reconciler.reconcile_all()


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff-base: valid only while no handler needs diffs (no on.create/update/resume/
    field handlers, no daemons or timers; on.event handlers and indexes get no diff)."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return None

    def fetch(self, *, body: Any) -> Any:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        return None


def configure(
    settings: kopf.OperatorSettings, list_page_size: int = DEFAULT_LIST_PAGE_SIZE
) -> None:
    """kopf settings: no kopf-posted events or progress writes; we post our own events."""
    settings.posting.enabled = False
    settings.persistence.finalizer = "mtp-operator.io/unused"  # no handler needs one
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.error_backoffs = [1, 2, 5, 10]
    # No worker limit: kopf runs one worker per watched object, and at start-up each waits
    # until every object of every indexed kind is indexed; with a limit below the number of
    # objects of one kind (64 pool Deployments or pods) the operator deadlocks before its first
    # reconcile (kopf issue #1243). Workers are idle asyncio tasks, cheap at thousands.
    settings.queueing.worker_limit = None
    settings.queueing.idle_timeout = WORKER_IDLE_SECONDS
    # kopf builds every event's "essence" (a deep copy of the body, minus status) to diff it
    # for on.create/update/resume handlers and daemons. There are none here (see the module
    # doc), so nothing is built or stored: about a fifth of the operator's CPU at scale.
    settings.persistence.diffbase_storage = NoDiffBase()
    # kopf filters `labels=` on the client: without these it would receive (and hold as
    # memories) every Deployment, Service and pod of the cluster. The API server filters
    # here, and only Running pods are watched: the pod index keeps only Ready pods, and a
    # pod's Pending phase (scheduling, image pulls, container creation) is most of its
    # watch events. A pod that leaves Running arrives as DELETED, and leaves the index.
    owned = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
    for kind in WATCHED_OWNED:
        settings.watching.label_selectors[kind] = owned
    settings.watching.field_selectors[POD_KIND] = RUNNING_PODS
    # The initial list of each kind comes in pages (settings.py: listPageSize): one response
    # with every pool Deployment of a large cluster is tens of MB of JSON parsed at once.
    settings.watching.chunk_size = list_page_size
    # Our resources are known; no CRD/namespace scanning (and no RBAC for it).
    settings.scanning.disabled = True
    # Every handled event would otherwise log a line; real problems still log as warnings.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
