"""Multi-node pools with the real LeaderWorkerSet controller (issue 38): sigs.k8s.io/lws v0.7.0's
manager, CRD and webhooks (tests/sandbox/lws_controller.py) on the sandbox's kwok GPU nodes.

A model too big for one H100 node becomes a LeaderWorkerSet of 2-pod groups, one pod per node;
the LWS controller makes the leader and worker StatefulSets and pods, its pod webhook gives them
the LWS environment the runtime reads; an alert rolls the pool back (the group's pods are made
again with the lower K); deleting the resource leaves nothing behind; the product that does
not fit is reported with its numbers."""

from __future__ import annotations

import json
import math
import time
import urllib.request
import uuid

import pytest
import yaml

from support.cluster_fixtures import get_json, wait_for
from support.operator_proc import free_port

pytestmark = pytest.mark.cluster

H100, L40S = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"
MIB = {H100: 81559, L40S: 46068}  # tests/sandbox/nodes.yaml memoryMiB
GPUS, TP, WEIGHTS, HEADROOM, MOST = 8, 8, 600.0, 0.2, 2
LWS_LABEL = "leaderworkerset.sigs.k8s.io/name"


def nodes_needed(product: str) -> int:
    return math.ceil(WEIGHTS / (GPUS * MIB[product] / 1024 * (1 - HEADROOM)))


def _k(runtime_config: str) -> int:
    return json.loads(runtime_config)["serve"]["num_speculative_tokens"]


def _pods(kubectl, namespace: str) -> list[dict]:
    return get_json(kubectl, "pods", "-n", namespace, "-l", LWS_LABEL)["items"]


def _env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}


def _post_alert(port: int, namespace: str, name: str, product: str) -> dict:
    payload = {"version": "4", "status": "firing", "alerts": [{
        "status": "firing",
        "labels": {"alertname": "MTPHitRateLow", "namespace": namespace,
                   "mtpinference": name, "gpu_product": product},
        "annotations": {"value": "0.05"},
        "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": uuid.uuid4().hex[:16],
    }]}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/alerts",
                                 data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_a_two_node_pool_is_created_rolled_back_and_removed(
    kubectl, namespace, start_operator, lws_controller
) -> None:
    assert nodes_needed(H100) == 2 and nodes_needed(L40S) > MOST  # 509.8 GiB a node; 287.9
    port = free_port()
    start_operator("--namespace", namespace, "--no-evaluator", "--alerts-address",
                   f"127.0.0.1:{port}")
    doc = {
        "apiVersion": "mtp-operator.io/v1alpha1", "kind": "MTPInference",
        "metadata": {"name": "ds", "namespace": namespace},
        "spec": {"model": "deepseek-ai/DeepSeek-V3", "tensorParallelSize": TP,
                 "gpuProducts": [H100, L40S],
                 "fit": {"weightsGiB": WEIGHTS, "headroom": HEADROOM,
                         "maxNodesPerReplica": MOST}},
    }
    kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))

    # created: one LeaderWorkerSet, a group of 2 pods on 2 H100 nodes, Ready
    def group_ready() -> list[dict] | None:
        pods = _pods(kubectl, namespace)
        running = [p for p in pods if p["status"].get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")]
        return running if len(running) == nodes_needed(H100) else None

    pods = wait_for(group_ready, 120, interval=0.5, message="the group's 2 pods Running")
    (lws,) = get_json(kubectl, "leaderworkersets", "-n", namespace)["items"]
    assert lws["metadata"]["ownerReferences"][0]["name"] == "ds"
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert get_json(kubectl, "deployments", "-n", namespace)["items"] == []
    assert len({p["spec"]["nodeName"] for p in pods}) == 2  # one pod per node
    assert all(p["spec"]["nodeName"].startswith("gpu-h100") for p in pods)
    roles = {p["metadata"]["labels"].get("leaderworkerset.sigs.k8s.io/worker-index"): p
             for p in pods}
    leader, worker = roles["0"], roles["1"]
    # the LWS pod webhook's environment, which mtp_runtime.multinode turns into vLLM flags
    for pod in (leader, worker):
        env = _env(pod)
        assert env["LWS_GROUP_SIZE"] == "2" and env["LWS_LEADER_ADDRESS"].startswith(
            f"{lws['metadata']['name']}-0.")
    assert _env(worker)["LWS_WORKER_INDEX"] == "1"
    k0 = _k(_env(leader)["MTP_RUNTIME_CONFIG"])
    assert _k(_env(worker)["MTP_RUNTIME_CONFIG"]) == k0
    mtpi = wait_for(lambda: (o := get_json(kubectl, "mtpi", "ds", "-n", namespace))[
        "status"].get("phase") == "Ready" and o, 90, message="phase Ready")
    pool = {p["gpuProduct"]: p for p in mtpi["status"]["pools"]}[H100]
    assert pool["nodesPerReplica"] == 2 and pool["numSpeculativeTokens"] == k0
    assert mtpi["status"]["ready"] == "1/1"

    # the refused product, with its numbers
    fit = {f["gpuProduct"]: f for f in mtpi["status"]["fit"]}
    assert fit[L40S]["verdict"] == "DoesNotFit" and fit[H100]["verdict"] == "MultiNode"
    assert f"{WEIGHTS:.0f} GiB" in fit[L40S]["message"]
    fits = next(c for c in mtpi["status"]["conditions"] if c["type"] == "ModelFits")
    assert fits["status"] == "False" and L40S in fits["message"]
    events = get_json(kubectl, "events", "-n", namespace,
                      "--field-selector", "reason=ProductDoesNotFit")["items"]
    assert len(events) == 1 and L40S in events[0]["message"]

    # rolled back: the group is made again, both pods with the lower K
    before = {p["metadata"]["uid"] for p in pods}
    assert _post_alert(port, namespace, "ds", H100)["status"] == "ok"

    def new_group() -> list[dict] | None:
        got = group_ready()
        if not got or {p["metadata"]["uid"] for p in got} & before:
            return None
        return got if all(_k(_env(p)["MTP_RUNTIME_CONFIG"]) == k0 - 1 for p in got) else None

    wait_for(new_group, 120, interval=0.5, message=f"the group again at K={k0 - 1}")
    mtpi = get_json(kubectl, "mtpi", "ds", "-n", namespace)
    assert [r["toK"] for r in mtpi["status"]["rollbacks"]] == [k0 - 1]
    pool = {p["gpuProduct"]: p for p in mtpi["status"]["pools"]}[H100]
    assert (pool["numSpeculativeTokens"], pool["rollbackK"]) == (k0 - 1, k0 - 1)

    # removed: the resource's deletion takes the LeaderWorkerSet, its StatefulSets and pods
    kubectl("delete", "mtpi", "ds", "-n", namespace, "--wait=false")

    def left() -> list[str]:
        return [
            f"{kind}: {[o['metadata']['name'] for o in items]}"
            for kind in ("leaderworkersets", "statefulsets", "pods", "deployments")
            if (items := get_json(kubectl, kind, "-n", namespace)["items"])
        ]

    wait_for(lambda: not left(), 120, interval=0.5, message="no LWS, StatefulSet or pod left")
    assert left() == []
