"""The pod projection (handlers.pod_for_index) keeps all the pod index reads: for pool pods
in each state, the index entry of the projected pod equals that of the whole pod."""

from __future__ import annotations

import copy

import pytest

from mtp_operator.app.handlers import POD_STATUS_READ, pod_for_index, pod_index_entry
from mtp_operator.naming import LABEL_GPU_PRODUCT, LABEL_RESOURCE

pytestmark = pytest.mark.unit


def _pool_pod(ready: bool, ip: str | None, product: str | None = "NVIDIA-H100-80GB-HBM3"):
    labels = {LABEL_RESOURCE: "qwen", "app.kubernetes.io/managed-by": "mtp-operator"}
    if product:
        labels[LABEL_GPU_PRODUCT] = product
    status = {
        "phase": "Running",
        "hostIP": "10.1.0.1",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ],
        "containerStatuses": [{"name": "vllm", "ready": ready, "restartCount": 0}],
    }
    if ip:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "qwen-h100-abc", "namespace": "team", "uid": "u1",
                     "resourceVersion": "42", "labels": labels},
        "spec": {"nodeName": "n1", "containers": [{"name": "vllm", "image": "img",
                 "args": ["--k", "6"], "env": [{"name": "MTP", "value": "x" * 500}]}]},
        "status": status,
    }  # fmt: skip


@pytest.mark.parametrize(
    "pod",
    [
        _pool_pod(True, "10.2.0.7"),
        _pool_pod(False, "10.2.0.7"),
        _pool_pod(True, None),
        _pool_pod(True, "10.2.0.7", product=None),
    ],
    ids=["ready", "not-ready", "no-ip", "no-product-label"],
)
def test_the_projection_keeps_what_the_pod_index_reads(pod) -> None:
    whole = copy.deepcopy(pod)
    projected = pod_for_index(pod)
    assert pod_index_entry(projected) == pod_index_entry(whole)
    assert pod == whole  # the projection does not change the pod it was given
    assert "spec" not in projected
    assert set(projected["status"]) <= set(POD_STATUS_READ)


def test_a_ready_pool_pod_is_indexed_by_namespace_resource_and_product() -> None:
    entry = pod_index_entry(pod_for_index(_pool_pod(True, "10.2.0.7")))
    assert entry == {("team", "qwen", "NVIDIA-H100-80GB-HBM3"): (
        "qwen-h100-abc", "10.2.0.7", {"labels": {}, "ownerReferences": []})}  # no owner


def test_compact_is_an_equal_copy_sharing_keys_and_short_strings() -> None:
    """Two pools parsed from JSON apart: compact copies are equal to them, share their keys
    and short strings, and keep long strings (a runtime config) as they are."""
    import json
    import sys

    from mtp_operator.adapters.kube import SHARED_STRING_MAX, compact

    long_value = "y" * (SHARED_STRING_MAX + 1)
    text = json.dumps(_pool_pod(True, "10.2.0.7") | {"note": long_value})
    a, b = json.loads(text), json.loads(text)
    key_a = next(k for k in a["spec"]["containers"][0] if k == "image")
    key_b = next(k for k in b["spec"]["containers"][0] if k == "image")
    assert key_a is not key_b  # the parser gives each document its own keys
    ca, cb = compact(a), compact(b)
    assert ca == a and cb == b
    ka = next(k for k in ca["spec"]["containers"][0] if k == "image")
    kb = next(k for k in cb["spec"]["containers"][0] if k == "image")
    assert ka is kb is sys.intern("image")
    assert ca["spec"]["containers"][0]["image"] is cb["spec"]["containers"][0]["image"]
    assert ca["note"] is a["note"] and ca["note"] is not cb["note"]
    assert ca["spec"] is not a["spec"]  # a copy: the watched body is never changed
