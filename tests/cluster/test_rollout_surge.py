"""A change of K against the real API server (issue 37): the operator surges a pool's rollout
where its GPU product has a spare slot and not where it has none, says which in a PoolRollout
Event, and keeps a PodDisruptionBudget per pool (written through the real adapter and RBAC
rules as the chart grants them). The sandbox's H100 product: two kwok nodes of 8 GPUs."""

from __future__ import annotations

import support.mtpi as mtpi
from support.cluster_fixtures import get_json, wait_for

H100 = "NVIDIA-H100-80GB-HBM3"
SPEC = {"model": "Qwen/Qwen3.6-27B", "tensorParallelSize": 8, "gpuProducts": [H100]}


def budget(kubectl, namespace: str) -> dict:
    (pdb,) = get_json(kubectl, "pdb", "-n", namespace)["items"]
    return pdb


def strategy(kubectl, namespace: str) -> dict:
    (dep,) = mtpi.deployments(kubectl, namespace).values()
    return dep["spec"]["strategy"]["rollingUpdate"]


def test_surge_where_a_slot_is_spare_and_a_budget_per_pool(kubectl, namespace, operator):
    mtpi.apply(kubectl, namespace, "srg", replicas=1,
               speculative={"numSpeculativeTokens": 2}, **SPEC)
    obj = mtpi.wait_ready(kubectl, namespace, "srg")
    pdb = wait_for(lambda: get_json(kubectl, "pdb", "-n", namespace)["items"])
    (dep,) = mtpi.deployments(kubectl, namespace).values()
    assert pdb[0]["spec"]["minAvailable"] == 0  # one replica: node drains are not blocked
    assert pdb[0]["spec"]["selector"] == dep["spec"]["selector"]
    assert pdb[0]["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    # one replica of 8 GPUs on 16: a spare slot, so K 2 -> 3 starts the new pod first
    mtpi.apply(kubectl, namespace, "srg", replicas=1,
               speculative={"numSpeculativeTokens": 3}, **SPEC)
    wait_for(lambda: strategy(kubectl, namespace) == {"maxSurge": 1, "maxUnavailable": 0})
    events = wait_for(lambda: mtpi.events(kubectl, namespace, "PoolRollout"))
    assert f"surge: a spare slot on {H100} (8 of 16 GPUs" in events[-1]["message"]
    mtpi.wait_ready(kubectl, namespace, "srg")
    # two replicas take all 16: K 3 -> 1 replaces one pod at a time, and the Event says so
    mtpi.apply(kubectl, namespace, "srg", replicas=2,
               speculative={"numSpeculativeTokens": 3}, **SPEC)
    wait_for(lambda: budget(kubectl, namespace)["spec"]["minAvailable"] == 1)
    mtpi.wait_ready(kubectl, namespace, "srg")
    mtpi.apply(kubectl, namespace, "srg", replicas=2,
               speculative={"numSpeculativeTokens": 1}, **SPEC)
    wait_for(lambda: strategy(kubectl, namespace) == {"maxSurge": 0, "maxUnavailable": 1})
    events = wait_for(lambda: [e for e in mtpi.events(kubectl, namespace, "PoolRollout")
                               if "no spare slot" in e["message"]])
    assert f"no spare slot on {H100} (0 of 16 GPUs" in events[-1]["message"]
    assert "1 of 2 replicas serve until the new pod is Ready" in events[-1]["message"]
