"""An in-memory cluster for the unit tests of the stateful loops (operator/mtp_operator/control).

`FakeKube` implements `control.ports.Kube` (the operator's writes) and `FakeView` implements
`control.ports.ClusterView` (what the watches show). Like the API server, `FakeKube` gives
every write a new resourceVersion, merge-patches status (RFC 7386: objects merged, lists
replaced, null deletes) and bumps a Deployment's generation when its spec changes. Nothing
reaches the view until `deliver()` — the watch events, in the order a test chooses — so a
test can check what a pass does before and after the watch catches up.
tests/unit/control/test_ports.py checks these classes against the real ones (same methods), and the
cluster tests run the same loops against a real kube-apiserver.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from mtp_operator.control.ports import Key
from mtp_operator.naming import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    LABEL_TRAFFIC_CLASS,
    service_name,
)
from mtp_operator.planning import GPUNode, gpu_node_from_body
from mtp_operator.reconcile_plan import product_of


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def api_error(code: int, message: str = "injected") -> ApiError:
    """An ApiError as lightkube raises it for an HTTP error status."""
    return ApiError(status=Status(code=code, message=message, status="Failure"))


def node(name: str, product: str, gpus: int = 8, schedulable: bool = True) -> GPUNode:
    """A Ready GPU node as GPU Feature Discovery labels it (through the real parser)."""
    body = {
        "metadata": {"name": name, "labels": {GPU_PRODUCT_LABEL: product}},
        "spec": {"unschedulable": not schedulable},
        "status": {
            "allocatable": {GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    parsed = gpu_node_from_body(body)
    assert parsed is not None
    return parsed


def mtpinference(
    name: str, spec: Mapping[str, Any], namespace: str = "ml", generation: int = 1, **meta: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "mtp-operator.io/v1alpha1",
        "kind": "MTPInference",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "generation": generation,
            "resourceVersion": "1",
            **meta,
        },
        "spec": dict(spec),
    }


@dataclass
class FakeKube:
    """control.ports.Kube in memory; `fail` maps a method name to the error it raises next."""

    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    statuses: dict[Key, dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[str, str, str, str]] = field(default_factory=list)  # name, reason, ...
    calls: list[tuple[str, str]] = field(default_factory=list)  # (method, object name)
    fail: dict[str, Exception] = field(default_factory=dict)
    rv: int = 100
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> labels

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _maybe_fail(self, method: str) -> None:
        err = self.fail.pop(method, None)
        if err is not None:
            raise err

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self._maybe_fail("apply_pdb" if obj["kind"] == "PodDisruptionBudget" else "apply")
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        # a pool's PodDisruptionBudget is counted apart: "apply" counts the pool writes
        self.calls.append(("apply_pdb" if obj["kind"] == "PodDisruptionBudget" else "apply",
                           meta["name"]))
        old = self.objects.get(key)
        if obj["kind"] == "Pod" and old is not None and old.get("spec") != obj.get("spec"):
            # as the API server answers: a pod's spec cannot be changed (but for a few fields)
            raise api_error(422, f"Pod \"{meta['name']}\" is invalid: spec: Forbidden: pod "
                                 "updates may not change fields other than ...")
        stored = copy.deepcopy(dict(obj))
        generation = (old or {}).get("metadata", {}).get("generation", 0)
        if old is None or old.get("spec") != stored.get("spec"):
            generation += 1
        stored["metadata"]["generation"] = generation
        stored["metadata"]["resourceVersion"] = self._next_rv()
        if old is not None and "status" in old:
            stored["status"] = old["status"]
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def replace(self, obj: Mapping[str, Any], resource_version: str | None) -> dict:
        self._maybe_fail("replace")
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        old = self.objects.get(key)
        if old is None:
            raise api_error(404, "not found")
        if resource_version is not None and old["metadata"]["resourceVersion"] != resource_version:
            raise api_error(409, "the object has been modified")
        self.calls.append(("replace", meta["name"]))
        stored = copy.deepcopy(dict(obj))  # a PUT: nothing of the old spec survives
        stored["metadata"]["generation"] = old["metadata"].get("generation", 0) + 1
        stored["metadata"]["resourceVersion"] = self._next_rv()
        if "status" in old:
            stored["status"] = old["status"]
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def namespace_labels(self, name: str) -> dict[str, str] | None:
        self._maybe_fail("namespace_labels")
        self.calls.append(("namespace_labels", name))
        labels = self.namespaces.get(name)
        return None if labels is None else dict(labels)

    async def delete_deployment(self, namespace: str, name: str) -> None:
        self._maybe_fail("delete_deployment")
        self.calls.append(("delete_deployment", name))
        self.objects.pop(("Deployment", namespace, name), None)

    async def delete_pdb(self, namespace: str, name: str) -> None:
        self._maybe_fail("delete_pdb")
        self.calls.append(("delete_pdb", name))
        self.objects.pop(("PodDisruptionBudget", namespace, name), None)

    async def delete_leaderworkerset(self, namespace: str, name: str) -> None:
        self._maybe_fail("delete_leaderworkerset")
        self.calls.append(("delete_leaderworkerset", name))
        self.objects.pop(("LeaderWorkerSet", namespace, name), None)

    async def delete_pod(self, namespace: str, name: str) -> None:
        self._maybe_fail("delete_pod")
        self.calls.append(("delete_pod", name))
        self.objects.pop(("Pod", namespace, name), None)

    async def delete_owned(self, kind: str, namespace: str, name: str, owner_uid: str) -> bool:
        """As the adapter: read (a call), then delete only what `owner_uid` controls."""
        self._maybe_fail("delete_owned")
        self.calls.append(("get", name))
        obj = self.objects.get((kind, namespace, name))
        if obj is None:
            return False
        refs = obj["metadata"].get("ownerReferences") or ()
        if not any(r.get("controller") is True and r.get("uid") == owner_uid for r in refs):
            return False
        self.calls.append(("delete", name))
        del self.objects[(kind, namespace, name)]
        return True

    async def patch_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        self._maybe_fail("patch_status")
        self.calls.append(("patch_status", name))
        key = (namespace, name)
        self.statuses[key] = merge_patch(self.statuses.get(key, {}), dict(status))
        return {
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": self._next_rv()},
            "status": copy.deepcopy(self.statuses[key]),
        }

    async def event(
        self, involved: Mapping[str, Any], reason: str, message: str, type_: str = "Normal"
    ) -> None:
        self.events.append((involved["metadata"]["name"], reason, message, type_))

    # ---- what tests look at ------------------------------------------------------------
    def deployments(self) -> dict[str, dict[str, Any]]:
        """Stored pool Deployments by pool key (the GPU product, `product/class` for a class
        pool)."""
        return {
            product_of(o) or "": o
            for (kind, _, _), o in self.objects.items()
            if kind == "Deployment"
        }

    def leaderworkersets(self) -> dict[str, dict[str, Any]]:
        """Stored multi-node pools (LeaderWorkerSets) by pool key."""
        return {
            product_of(o) or "": o
            for (kind, _, _), o in self.objects.items()
            if kind == "LeaderWorkerSet"
        }

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)

    def reasons(self) -> list[str]:
        return [reason for _, reason, _, _ in self.events]


@dataclass
class FakeView:
    """control.ports.ClusterView in memory, fed by `deliver()` (the watches)."""

    resources: dict[Key, dict[str, Any]] = field(default_factory=dict)
    nodes: list[GPUNode] = field(default_factory=list)
    deployments: dict[Key, dict[str, dict[str, Any]]] = field(default_factory=dict)
    services: set[Key] = field(default_factory=set)
    service_selectors: dict[Key, dict[str, str]] = field(default_factory=dict)  # own Service
    class_service_names: dict[Key, dict[str, str]] = field(default_factory=dict)  # name → class
    pods: dict[tuple[Key, str], dict[str, str]] = field(default_factory=dict)
    claims: set[tuple[str, str]] = field(default_factory=set)  # (namespace, name)
    canaries: dict[Key, dict[str, dict[str, Any]]] = field(default_factory=dict)
    listed: bool = True

    @property
    def ready(self) -> bool:
        return self.listed

    def add(self, body: dict[str, Any]) -> Key:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        self.resources[key] = body
        return key

    def resource(self, key: Key) -> Mapping[str, Any] | None:
        return self.resources.get(key)

    def resource_keys(self) -> Iterable[Key]:
        return list(self.resources)

    def gpu_nodes(self) -> Iterable[GPUNode]:
        return list(self.nodes)

    def pool_deployments(self, key: Key) -> Mapping[str, Mapping[str, Any]]:
        return dict(self.deployments.get(key, {}))

    def pool_pod_ips(self, key: Key, product: str) -> dict[str, str]:
        return dict(self.pods.get((key, product), {}))

    def has_service(self, key: Key) -> bool:
        return key in self.services

    def service_selector(self, key: Key) -> Mapping[str, str] | None:
        return self.service_selectors.get(key) if key in self.services else None

    def class_services(self, key: Key) -> Mapping[str, str]:
        return dict(self.class_service_names.get(key, {}))

    def canary_pods(self, key: Key) -> Mapping[str, Mapping[str, Any]]:
        return dict(self.canaries.get(key, {}))

    def has_claim(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self.claims

    def deliver(self, kube: FakeKube, *, ready: bool = False) -> None:
        """The watch events for everything `kube` holds: statuses into the resources,
        owned Deployments (with a Deployment controller's status: all replicas updated,
        and Ready when `ready`) and Services into the view."""
        for key, status in kube.statuses.items():
            if key in self.resources:
                body = self.resources[key]
                body["status"] = copy.deepcopy(status)
                body["metadata"]["resourceVersion"] = str(kube.rv)
        self.deployments = {}
        self.services = set()
        self.class_service_names = {}
        self.canaries = {}
        for (kind, namespace, name), obj in kube.objects.items():
            owner = obj["metadata"]["ownerReferences"][0]["name"]
            key = (namespace, owner)
            if kind == "Service":
                self.services.add(key)
                if name == service_name(owner):
                    self.service_selectors[key] = dict(obj["spec"].get("selector") or {})
                traffic_class = (obj["spec"].get("selector") or {}).get(LABEL_TRAFFIC_CLASS)
                if traffic_class:
                    self.class_service_names.setdefault(key, {})[name] = traffic_class
                continue
            if kind == "Pod":  # a tuning canary: its pod IP goes into `pods` by the test
                self.canaries.setdefault(key, {})[name] = copy.deepcopy(obj["metadata"])
                continue
            if kind == "LeaderWorkerSet":  # a multi-node pool, as the LWS controller reports
                want = obj["spec"].get("replicas", 1)
                obj["status"] = {"replicas": want, "updatedReplicas": want,
                                 "readyReplicas": want if ready else 0}
                self.deployments.setdefault(key, {})[product_of(obj) or ""] = copy.deepcopy(obj)
                continue
            if kind != "Deployment":  # a class resource's InferencePool, ConfigMap
                continue
            if kind == "PodDisruptionBudget":  # not watched
                continue
            want = obj["spec"].get("replicas", 1)
            obj["status"] = {
                "observedGeneration": obj["metadata"]["generation"],
                "replicas": want,
                "updatedReplicas": want,
                "readyReplicas": want if ready else 0,
            }
            product = product_of(obj) or ""  # the pool key
            self.deployments.setdefault(key, {})[product] = copy.deepcopy(obj)
