"""Pool membership proven by ownership, not by labels (issue 36).

A pod that carries a pool's labels (a copied manifest, another chart's pods) is neither scraped
as the pool's (the built-in evaluator and the tuner read `ClusterView.pool_pod_ips`) nor
selected by the resource's Service: scraping counts only pods controlled by a ReplicaSet of
the pool's Deployment, or canaries controlled by the resource (by UID); the Service selects
on the owner's UID label, and on a resource whose pools predate that label it does so only
once every pod of the resource carries it."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from mtp_operator.app.handlers import KopfView, pod_index_entry
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.naming import (
    LABEL_CANARY,
    LABEL_GPU_PRODUCT,
    LABEL_OWNER_UID,
    LABEL_POD_TEMPLATE_HASH,
    LABEL_RESOURCE,
    canary_pod_name,
    pool_deployment_name,
    service_name,
)
from mtp_operator.settings import OperatorSettings
from support.fake_cluster import FakeKube, FakeView, mtpinference, node

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)
KEY = ("ml", "res")
UID = "6f1c2b1e-0000-4000-8000-00000000abcd"
PRODUCT = "NVIDIA-H100-80GB-HBM3"
DEPLOYMENT = pool_deployment_name("res", PRODUCT)


def _pod(name: str, ip: str, owner: dict[str, Any] | None, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name, "namespace": "ml",
        "labels": {LABEL_RESOURCE: "res", LABEL_GPU_PRODUCT: PRODUCT,
                   "app.kubernetes.io/managed-by": "mtp-operator", **labels},
    }
    if owner is not None:
        meta["ownerReferences"] = [{"controller": True, "blockOwnerDeletion": True, **owner}]
    return {"metadata": meta, "status": {
        "phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}


def _rs(name: str) -> dict[str, str]:
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": "rs-uid"}


def _resource(uid: str) -> dict[str, str]:
    return {"apiVersion": "mtp-operator.io/v1alpha1", "kind": "MTPInference", "name": "res",
            "uid": uid}


class _Store(dict):
    """kopf's index: {key: [values]}."""


def _view(pods: list[dict[str, Any]]) -> KopfView:
    view = KopfView()
    index = _Store()
    for pod in pods:
        for k, v in pod_index_entry(pod).items():
            index.setdefault(k, []).append(v)
    view.pods = index
    view.resources = {KEY: [{"metadata": {"name": "res", "namespace": "ml", "uid": UID}}]}
    return view


def test_only_pods_the_pool_owns_are_scraped() -> None:
    canary = canary_pod_name("res", PRODUCT, 3)
    pods = [
        # the pool's own: controlled by a ReplicaSet of its Deployment
        _pod(f"{DEPLOYMENT}-7d9f8-abcde", "10.0.0.1", _rs(f"{DEPLOYMENT}-7d9f8"),
             **{LABEL_POD_TEMPLATE_HASH: "7d9f8", LABEL_OWNER_UID: UID}),
        # made by an earlier version (no owner-uid label): still the pool's by ownership
        _pod(f"{DEPLOYMENT}-5c4b3-fghij", "10.0.0.2", _rs(f"{DEPLOYMENT}-5c4b3"),
             **{LABEL_POD_TEMPLATE_HASH: "5c4b3"}),
        # a canary of this resource
        _pod(canary, "10.0.0.3", _resource(UID), **{LABEL_CANARY: "true", LABEL_OWNER_UID: UID}),
        # a LeaderWorkerSet pool's leader: controlled by the StatefulSet named as the pool
        _pod(f"{DEPLOYMENT}-0", "10.0.0.4",
             {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": DEPLOYMENT, "uid": "s"},
             **{LABEL_OWNER_UID: UID}),
        # the pool's labels and no owner: a copied manifest
        _pod("impostor", "10.0.0.66", None, **{LABEL_OWNER_UID: UID}),
        # owned by a ReplicaSet of another Deployment whose name starts like the pool's
        _pod("other", "10.0.0.67", _rs(f"{DEPLOYMENT}-x-7d9f8"),
             **{LABEL_POD_TEMPLATE_HASH: "7d9f8"}),
        # the hash label does not match the ReplicaSet's name
        _pod("mismatch", "10.0.0.68", _rs(f"{DEPLOYMENT}-7d9f8"),
             **{LABEL_POD_TEMPLATE_HASH: "00000"}),
        # a "canary" owned by another (or a deleted and re-made) resource of the same name
        _pod("stale-canary", "10.0.0.69", _resource("another-uid"), **{LABEL_CANARY: "true"}),
        # a canary label on a ReplicaSet's pod: a canary is the resource's alone
        _pod("rs-canary", "10.0.0.70", _rs(f"{DEPLOYMENT}-7d9f8"),
             **{LABEL_POD_TEMPLATE_HASH: "7d9f8", LABEL_CANARY: "true"}),
    ]
    view = _view(pods)
    assert view.pool_pod_ips(KEY, PRODUCT) == {
        f"{DEPLOYMENT}-7d9f8-abcde": "10.0.0.1",
        f"{DEPLOYMENT}-5c4b3-fghij": "10.0.0.2",
        canary: "10.0.0.3",
        f"{DEPLOYMENT}-0": "10.0.0.4",
    }


def test_a_resource_gone_from_the_view_has_no_members() -> None:
    view = _view([_pod(f"{DEPLOYMENT}-7d9f8-abcde", "10.0.0.1", _rs(f"{DEPLOYMENT}-7d9f8"),
                       **{LABEL_POD_TEMPLATE_HASH: "7d9f8"})])
    view.resources = {}
    assert view.pool_pod_ips(KEY, PRODUCT) == {}


# ---- the Service -----------------------------------------------------------------------------


def _service_applies(kube: FakeKube) -> list[dict[str, Any]]:
    return [copy.deepcopy(kube.objects[("Service", "ml", service_name("res"))])
            for m, n in kube.calls if m == "apply" and n == service_name("res")]


async def test_a_new_resources_service_selects_its_own_pods_only() -> None:
    kube = FakeKube()
    view = FakeView(nodes=[node("n1", PRODUCT)])
    view.add(mtpinference("res", {"model": "org/model", "tensorParallelSize": 8}, uid=UID))
    await Reconciler(kube, view, OperatorSettings(), clock=lambda: T0).reconcile(KEY)
    (svc,) = _service_applies(kube)
    assert svc["spec"]["selector"] == {LABEL_RESOURCE: "res", LABEL_OWNER_UID: UID}
    dep = kube.deployments()[PRODUCT]
    assert dep["spec"]["template"]["metadata"]["labels"][LABEL_OWNER_UID] == UID


async def test_an_upgraded_resources_service_is_tightened_only_once_every_pod_has_the_label(
) -> None:
    """The pools and Service as an earlier version made them: the Service keeps selecting by
    the resource label alone (tightening it now would drop the serving pods) until every pool
    has rolled out with the owner's UID label on its pods; then one apply tightens it."""
    kube = FakeKube()
    view = FakeView(nodes=[node("n1", PRODUCT)])
    view.add(mtpinference("res", {"model": "org/model", "tensorParallelSize": 8}, uid=UID))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    await rec.reconcile(KEY)
    # as the earlier version left them: no owner-uid label anywhere
    svc = kube.objects[("Service", "ml", service_name("res"))]
    del svc["spec"]["selector"][LABEL_OWNER_UID]
    dep = kube.objects[("Deployment", "ml", DEPLOYMENT)]
    del dep["spec"]["template"]["metadata"]["labels"][LABEL_OWNER_UID]
    view.deliver(kube, ready=True)
    kube.calls.clear()
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)  # the upgraded one
    for _ in range(2):
        await rec.reconcile(KEY)
        view.deliver(kube, ready=True)
    assert _service_applies(kube) == []  # labels are no drift: nothing rolled, nothing cut
    assert view.service_selector(KEY) == {LABEL_RESOURCE: "res"}
    # the pool's next roll (here a spec edit) puts the label on its template; while the
    # rollout runs (old pods still counted) the Service stays as it was
    view.add(mtpinference("res", {"model": "org/model", "tensorParallelSize": 8,
                                  "replicas": 2}, generation=2, uid=UID))
    await rec.reconcile(KEY)
    dep = kube.objects[("Deployment", "ml", DEPLOYMENT)]
    assert dep["spec"]["template"]["metadata"]["labels"][LABEL_OWNER_UID] == UID
    view.deliver(kube, ready=True)
    mid = view.deployments[KEY][PRODUCT]
    mid["status"].update(replicas=3, updatedReplicas=1)  # one new pod, two old ones
    await rec.reconcile(KEY)
    assert _service_applies(kube) == []
    # rolled out: every counted pod is of the new template
    view.deliver(kube, ready=True)
    await rec.reconcile(KEY)
    (svc,) = _service_applies(kube)
    assert svc["spec"]["selector"] == {LABEL_RESOURCE: "res", LABEL_OWNER_UID: UID}
    view.deliver(kube, ready=True)
    kube.calls.clear()
    await rec.reconcile(KEY)
    assert _service_applies(kube) == []  # once tight, quiet


async def test_a_canary_without_the_label_holds_the_service_back() -> None:
    from mtp_operator.naming import owner_label_rolled_out

    dep = {"metadata": {"generation": 2},
           "spec": {"replicas": 1, "template": {"metadata": {"labels": {LABEL_OWNER_UID: UID}}}},
           "status": {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1}}
    assert owner_label_rolled_out([dep], [], UID)
    assert not owner_label_rolled_out([dep], [{"labels": {LABEL_CANARY: "true"}}], UID)
    assert not owner_label_rolled_out([dep], [], "another-uid")
    unseen = copy.deepcopy(dep)
    unseen["status"]["observedGeneration"] = 1  # the controller has not seen the new template
    assert not owner_label_rolled_out([unseen], [], UID)
    assert owner_label_rolled_out([], [], UID)  # a new resource: nothing to wait for
