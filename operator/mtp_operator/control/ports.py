"""What the stateful loops need from the outside, as protocols: the Kubernetes writes
(`Kube`, implemented by adapters/kube.KubeClient), the watched cluster (`ClusterView`,
implemented by app/handlers.KopfView over kopf's indexes) and, for the loops beside the
reconciler (the tuner), the reconcile core (`ReconcileCore`, implemented by
control/reconciler.Reconciler). tests/support/fake_cluster.py implements the first two for
the unit tests of control/; tests/unit/control/test_ports.py checks that the real classes
and the fakes have the same methods.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from mtp_operator.adapters.kube import TransportError
from mtp_operator.api.v1alpha1 import MTPInferenceSpec, MTPInferenceStatus
from mtp_operator.planning import GPUNode
from mtp_operator.reconcile_plan import Fold
from mtp_operator.validation import Problem

__all__ = ["ClusterView", "Key", "Kube", "ParsedSpec", "ReconcileCore", "TransportError"]

Key = tuple[str, str]  # (namespace, name) of an MTPInference
# a resource's spec as validation.spec_problems reads it: the typed spec (None when it does
# not parse) and its problems
ParsedSpec = tuple[MTPInferenceSpec | None, list[Problem]]


@runtime_checkable
class Kube(Protocol):
    """The operator's writes. Each raises lightkube's ApiError or TransportError on failure
    (`event` logs and swallows them: an Event is a notification)."""

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply; returns the object as stored (with its resourceVersion)."""
        ...

    async def replace(self, obj: Mapping[str, Any], resource_version: str | None) -> dict:
        """Replace (PUT) `obj` as a whole, conditional on `resource_version`: removes fields
        other field managers added, which server-side apply never does."""
        ...

    async def namespace_labels(self, name: str) -> dict[str, str] | None:
        """A Namespace's labels; None when there is no such namespace (the webhook's opt-in,
        adapters/namespaces.py)."""
        ...

    async def delete_deployment(self, namespace: str, name: str) -> None: ...
    async def delete_pdb(self, namespace: str, name: str) -> None: ...

    async def delete_leaderworkerset(self, namespace: str, name: str) -> None:
        """Delete a multi-node pool's LeaderWorkerSet (404: already gone)."""
        ...

    async def delete_pod(self, namespace: str, name: str) -> None: ...

    async def delete_owned(self, kind: str, namespace: str, name: str, owner_uid: str) -> bool:
        """Delete a routing object (`Service`, `ConfigMap`, `InferencePool`) only if its
        controller ownerReference is the owner with `owner_uid`; False when it is gone
        (404) or not that owner's (left alone)."""
        ...

    async def patch_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch an MTPInference's status; returns the updated object."""
        ...

    async def event(
        self, involved: Mapping[str, Any], reason: str, message: str, type_: str = "Normal"
    ) -> None: ...


@runtime_checkable
class ClusterView(Protocol):
    """What the loops read, kept current by watches; reads make no API request."""

    @property
    def ready(self) -> bool:
        """False until the first listing of every watched kind is in."""
        ...

    def resource(self, key: Key) -> Mapping[str, Any] | None: ...
    def resource_keys(self) -> Iterable[Key]: ...
    def gpu_nodes(self) -> Iterable[GPUNode]: ...
    def pool_deployments(self, key: Key) -> Mapping[str, Mapping[str, Any]]:
        """The resource's pool objects by pool key: Deployments, and the LeaderWorkerSets
        of multi-node pools (lws.is_leaderworkerset tells them apart)."""
        ...

    def pool_pod_ips(self, key: Key, product: str) -> dict[str, str]:
        """Ready pods of one pool, proven its by ownership (naming.pool_member):
        {pod name: pod IP}."""
        ...

    def has_service(self, key: Key) -> bool: ...

    def service_selector(self, key: Key) -> Mapping[str, str] | None:
        """The resource's own Service's selector as watched; None while it is not shown."""
        ...

    def class_services(self, key: Key) -> Mapping[str, str]:
        """The resource's traffic class Services the watch shows: {Service name: its class}
        (those whose selector has mtp-operator.io/traffic-class)."""
        ...

    def canary_pods(self, key: Key) -> Mapping[str, Mapping[str, Any]]:
        """The resource's tuning canary pods the watch shows (Running ones): {pod name: its
        metadata (labels, annotations, deletionTimestamp)}."""
        ...

    def has_claim(self, namespace: str, name: str) -> bool:
        """A PersistentVolumeClaim exists (a model cache's, spec.modelCache)."""
        ...


@runtime_checkable
class ReconcileCore(Protocol):
    """The reconciler as a loop beside it uses it (the tuner): what it reads of a resource,
    kept by the reconciler, and the one way in for what it decides."""

    def spec_of(self, key: Key, body: Mapping[str, Any]) -> ParsedSpec:
        """The resource's spec and its problems, parsed once a spec (the resource's slot
        memo, which passes read too), not every round."""
        ...

    def current_status(self, key: Key, body: Mapping[str, Any]) -> MTPInferenceStatus:
        """The freshest status known: the watched body's, or the reconciler's newer write."""
        ...

    async def fold_pass(
        self,
        key: Key,
        fold: Callable[[], Awaitable[Fold | None]],
        then: Callable[[BaseException | None], Awaitable[None]] | None = None,
        after: Callable[[Any], Awaitable[None]] | None = None,
    ) -> Exception | None:
        """Under the resource's lock, one pass with what `fold()` returns (None: no pass),
        then `then(error)` still under the lock and `after(error)` outside it; a pool
        write's error is returned, any other raised (Reconciler.fold_pass)."""
        ...
