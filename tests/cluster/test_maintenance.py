"""Pools survive what operators do to nodes (real sandbox): cordons, NotReady, drains, a lost
GPU count keep a serving pool as it runs; only a product that no node carries any more is
removed, after the grace period. The operator's view of a node follows its label and GPU
capacity at once."""

from __future__ import annotations

import json
import time
import uuid

import yaml

import support.mtpi as mtpi_helpers
from support.cluster_fixtures import get_json, wait_for

A100 = mtpi_helpers.A100
GRACE = 6  # seconds; the operator's poolRemovalGraceSeconds for these tests


def _node(name: str, product: str) -> str:
    gpus = {"cpu": "64", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "type": "kwok", "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": "8",
            "kubernetes.io/hostname": name},
            "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "status": {"capacity": gpus, "allocatable": gpus},
    })


def _deployments(kubectl, namespace: str) -> dict[str, dict]:
    return mtpi_helpers.deployments(kubectl, namespace)


def _pods(kubectl, namespace: str, product: str) -> set[str]:
    items = get_json(kubectl, "pods", "-n", namespace)["items"]
    return {p["metadata"]["name"] for p in items
            if p["metadata"]["labels"].get("mtp-operator.io/gpu-product") == product
            and not p["metadata"].get("deletionTimestamp")}


def _retained(kubectl, namespace: str, name: str, product: str, reason: str):
    obj = mtpi_helpers.resource(kubectl, namespace, name)
    cond = mtpi_helpers.condition(obj, "PoolsRetained")
    pool = next((p for p in obj["status"].get("pools") or [] if p["gpuProduct"] == product), {})
    if cond.get("status") == "True" and pool.get("retained") == reason:
        return obj
    return None


def _events(kubectl, namespace: str, reason: str) -> list[str]:
    items = get_json(kubectl, "events", "-n", namespace)["items"]
    return [e["message"] for e in items if e["reason"] == reason]


def test_pools_survive_cordon_notready_lost_gpus_and_go_only_when_the_product_is_gone(
    kubectl, namespace, start_operator, tmp_path
):
    settings = tmp_path / "settings.yaml"
    settings.write_text(json.dumps({"poolRemovalGraceSeconds": GRACE}))
    start_operator("--namespace", namespace, "--no-evaluator", "--settings", str(settings))
    tag = uuid.uuid4().hex[:4].upper()
    product = f"NVIDIA-B200-M{tag}"
    names = [f"gpu-maint-{tag.lower()}-{i}" for i in range(2)]
    try:
        for n in names:
            kubectl("apply", "-f", "-", input=_node(n, product))
        mtpi_helpers.apply(kubectl, namespace, "maint", gpuProducts=[product, A100])
        wait_for(lambda: product in _deployments(kubectl, namespace), 60, message="pool")
        mtpi_helpers.wait_ready(kubectl, namespace, "maint")
        uid = _deployments(kubectl, namespace)[product]["metadata"]["uid"]
        pods = wait_for(lambda: _pods(kubectl, namespace, product), 60, message="pods")

        # 1. cordon every node of the product (a driver upgrade): kept, reported, Event
        for n in names:
            kubectl("cordon", n)
        obj = wait_for(lambda: _retained(kubectl, namespace, "maint", product,
                                         "NoSchedulableNode"), 30, message="retained")
        assert "pods keep running" in mtpi_helpers.condition(obj, "PoolsRetained")["message"]
        assert any(product in m for m in _events(kubectl, namespace, "PoolRetained"))
        time.sleep(GRACE + 2)  # well past the grace period: cordoned is not gone
        assert _deployments(kubectl, namespace)[product]["metadata"]["uid"] == uid
        assert _pods(kubectl, namespace, product) == pods  # the same pods, still running
        assert mtpi_helpers.resource(kubectl, namespace, "maint")["status"]["phase"] == "Ready"

        # 2. NotReady and GPUs not allocatable (device plugin restart): still kept
        for n in names:
            kubectl("uncordon", n)
            kubectl("patch", "node", n, "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": {"allocatable": {"nvidia.com/gpu": "0"}}}))
        time.sleep(GRACE + 2)
        assert _retained(kubectl, namespace, "maint", product, "NoSchedulableNode")
        assert _deployments(kubectl, namespace)[product]["metadata"]["uid"] == uid

        # back to normal: the pool is planned again and the condition turns False
        for n in names:
            kubectl("patch", "node", n, "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": {"allocatable": {"nvidia.com/gpu": "8"}}}))
        wait_for(lambda: mtpi_helpers.condition(
            mtpi_helpers.resource(kubectl, namespace, "maint"), "PoolsRetained"
        ).get("status") == "False", 30, message="PoolsRetained False")
        assert "retained" not in mtpi_helpers.pool(
            mtpi_helpers.resource(kubectl, namespace, "maint"), product)

        # 3. the label goes from every node: the operator sees it at once (ProductGone with a
        # deadline), keeps the pool for the grace period, then removes it
        removed_at = time.monotonic()
        for n in names:
            kubectl("label", "node", n, "nvidia.com/gpu.product-")
        obj = wait_for(lambda: _retained(kubectl, namespace, "maint", product, "ProductGone"),
                       GRACE - 1, interval=0.2, message="ProductGone seen at once")
        assert mtpi_helpers.pool(obj, product)["productGoneSince"]
        assert product in _deployments(kubectl, namespace)
        wait_for(lambda: product not in _deployments(kubectl, namespace), 30 + GRACE,
                 message="pool removed after the grace period")
        assert time.monotonic() - removed_at >= GRACE - 1
        obj = mtpi_helpers.resource(kubectl, namespace, "maint")
        assert product in obj["status"]["removedPools"]
        assert product not in {p["gpuProduct"] for p in obj["status"]["pools"]}
        assert any(product in m for m in _events(kubectl, namespace, "PoolRemoved"))
        assert A100 in _deployments(kubectl, namespace)  # the other pool untouched
    finally:
        kubectl("delete", "node", *names, "--ignore-not-found")


def test_node_view_follows_relabels_and_gpu_capacity(kubectl, namespace, start_operator,
                                                    tmp_path):
    """A relabelled node leaves its old product at once; a node whose GPU capacity drops to 0
    too. (Before: a removed label left a phantom node of that product forever.)"""
    settings = tmp_path / "settings.yaml"
    settings.write_text(json.dumps({"poolRemovalGraceSeconds": 3600}))
    start_operator("--namespace", namespace, "--no-evaluator", "--settings", str(settings))
    tag = uuid.uuid4().hex[:4].upper()
    old, new = f"NVIDIA-B200-R{tag}", f"NVIDIA-GB200-R{tag}"
    name = f"gpu-relabel-{tag.lower()}"
    try:
        kubectl("apply", "-f", "-", input=_node(name, old))
        mtpi_helpers.apply(kubectl, namespace, "relabel", gpuProducts=[old, new, A100])
        wait_for(lambda: old in _deployments(kubectl, namespace), 60, message="old pool")
        kubectl("label", "node", name, f"nvidia.com/gpu.product={new}", "--overwrite")
        wait_for(lambda: new in _deployments(kubectl, namespace), 30, message="new pool")
        assert wait_for(lambda: _retained(kubectl, namespace, "relabel", old, "ProductGone"),
                        15, message="old product gone from the view")
        # GPU capacity to 0: no node of `new` any more either
        kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p",
                json.dumps({"status": {"capacity": {"nvidia.com/gpu": "0"},
                                       "allocatable": {"nvidia.com/gpu": "0"}}}))
        assert wait_for(lambda: _retained(kubectl, namespace, "relabel", new, "ProductGone"),
                        15, message="capacity 0 leaves the view")
    finally:
        kubectl("delete", "node", name, "--ignore-not-found")


def test_fields_added_by_hand_to_a_pool_are_reverted(kubectl, namespace, start_operator):
    """Drift is every field: an added env entry, args, a volume and a sidecar (kubectl patch,
    another field manager) go again; server-side apply alone would keep them."""
    start_operator("--namespace", namespace, "--no-evaluator")
    mtpi_helpers.apply(kubectl, namespace, "added", gpuProducts=[A100])
    mtpi_helpers.wait_ready(kubectl, namespace, "added")
    dep = _deployments(kubectl, namespace)[A100]
    name = dep["metadata"]["name"]
    pod = dep["spec"]["template"]["spec"]
    patch = {"spec": {"template": {"spec": {
        "containers": [
            {"name": "vllm", "args": ["--enforce-eager"],
             "env": [{"name": "HAND_ADDED", "value": "1"}]},
            {"name": "sidecar", "image": "busybox:1"},
        ],
        "volumes": [{"name": "extra", "emptyDir": {}}],
    }}}}
    kubectl("patch", "deployment", name, "-n", namespace, "--type=strategic",
            "-p", json.dumps(patch))

    def reverted():
        now = _deployments(kubectl, namespace)[A100]["spec"]["template"]["spec"]
        names = [c["name"] for c in now["containers"]]
        c0 = now["containers"][0]
        return (names == ["vllm"] and "args" not in c0
                and "HAND_ADDED" not in {e["name"] for e in c0.get("env") or []}
                and [v["name"] for v in now["volumes"]] == [v["name"] for v in pod["volumes"]])

    wait_for(reverted, 30, message="added fields reverted")
    msgs = _events(kubectl, namespace, "ManualChangeReverted")
    assert any("added" in m and "sidecar" in m for m in msgs), msgs
    time.sleep(3)  # and no hot loop: nothing more to revert
    assert len(_events(kubectl, namespace, "ManualChangeReverted")) == len(msgs)
