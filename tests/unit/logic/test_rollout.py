"""How a pool's pods are replaced (mtp_operator.rollout, issue 37): spare slots per product,
the surge decision, the disruption budget. Pure: nodes and Deployments are plain values."""

from __future__ import annotations

from typing import Any

import pytest

from mtp_operator import builders, rollout
from mtp_operator.naming import ANNOTATION_SETTINGS_HASH
from mtp_operator.planning import GPUNode

pytestmark = pytest.mark.unit

H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"


def gpu_node(name: str, product: str, gpus: int, schedulable: bool = True) -> GPUNode:
    return GPUNode(name=name, product=product, allocatable_gpus=gpus, labels={},
                   schedulable=schedulable, capacity_gpus=gpus)


def deploy(replicas: int, gpus: int | str, *, template_hash: str = "a",
           requests_only: bool = False) -> dict[str, Any]:
    resources = {"requests" if requests_only else "limits": {"nvidia.com/gpu": str(gpus)}}
    return {"spec": {"replicas": replicas, "template": {
        "metadata": {"annotations": {ANNOTATION_SETTINGS_HASH: template_hash}},
        "spec": {"containers": [{"name": "vllm", "resources": resources}]}}}}


def test_room_counts_schedulable_nodes_of_the_product_and_every_pool() -> None:
    nodes = [gpu_node("h1", H100, 8), gpu_node("h2", H100, 8),
             gpu_node("h3", H100, 8, schedulable=False), gpu_node("l1", L40S, 4)]
    pools = [deploy(1, 8), deploy(2, 2), deploy(0, 8), deploy(1, 1, requests_only=True)]
    room = rollout.product_room(H100, nodes, pools)
    # 8 + 8 allocatable (h3 cordoned, l1 another product); 8 + 2*2 + 0 + 1 requested
    assert (room.allocatable_gpus, room.requested_gpus, room.largest_node_gpus) == (16, 13, 8)
    assert room.spare_gpus == 3
    assert rollout.product_room(L40S, nodes, []).spare_gpus == 4
    overbooked = rollout.product_room(H100, nodes, [deploy(3, 8)])
    assert overbooked.spare_gpus == 0  # never negative


@pytest.mark.parametrize(
    ("allocatable", "requested", "largest", "gpus", "replicas", "surge"),
    [
        (16, 8, 8, 8, 1, True),    # one 8-GPU slot free: a 1-replica pool has no downtime
        (16, 9, 8, 8, 1, False),   # 7 free: not a slot
        (16, 8, 4, 8, 1, False),   # 8 free, but no node has 8 GPUs
        (8, 8, 8, 8, 2, False),    # full
        (4, 2, 4, 1, 2, True),
        (4, 2, 4, 0, 2, True),     # a pod without GPUs still needs room for one (never 0)
        (0, 0, 0, 1, 1, False),
        (16, 0, 8, 8, 0, False),   # nothing to replace
    ],
)
def test_surge_decision(allocatable: int, requested: int, largest: int, gpus: int,
                        replicas: int, surge: bool) -> None:
    room = rollout.ProductRoom(H100, allocatable, requested, largest)
    decision = rollout.surge_decision(room, gpus, replicas)
    assert decision.surge is surge
    assert decision.rolling_update == ({"maxSurge": 1, "maxUnavailable": 0} if surge
                                       else {"maxSurge": 0, "maxUnavailable": 1})
    if not surge and replicas:
        assert "no spare slot" in decision.message
        assert f"{room.spare_gpus} of {allocatable} GPUs" in decision.message
        if replicas == 1:
            assert "the pool is down until the new pod is Ready" in decision.message


def test_host_network_never_surges() -> None:
    room = rollout.ProductRoom(H100, 64, 0, 8)
    assert rollout.surge_decision(room, 8, 2).surge
    decision = rollout.surge_decision(room, 8, 2, host_network=True)
    assert not decision.surge and decision.message.startswith("hostNetwork")
    assert "1 of 2 replicas serve" in decision.message


def test_rolls_pods_only_when_the_template_changes() -> None:
    old = deploy(1, 8, template_hash="a")
    assert not rollout.rolls_pods(deploy(1, 8, template_hash="a"), None,
                                  ANNOTATION_SETTINGS_HASH)  # a new pool replaces nothing
    assert not rollout.rolls_pods(deploy(3, 8, template_hash="a"), old,
                                  ANNOTATION_SETTINGS_HASH)  # a scale
    assert rollout.rolls_pods(deploy(1, 8, template_hash="b"), old, ANNOTATION_SETTINGS_HASH)


def test_rolling_update_copy_and_the_observed_one() -> None:
    desired = deploy(2, 8)
    desired["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": dict(rollout.NO_SURGE)}
    surged = rollout.with_rolling_update(desired, rollout.SURGE)
    assert surged["spec"]["strategy"]["rollingUpdate"] == rollout.SURGE
    assert desired["spec"]["strategy"]["rollingUpdate"] == rollout.NO_SURGE  # not touched
    assert surged["spec"]["template"] is desired["spec"]["template"]
    assert rollout.observed_rolling_update(surged) == rollout.SURGE
    assert rollout.observed_rolling_update(None) is None
    percent = {"spec": {"strategy": {"rollingUpdate": {"maxSurge": "25%",
                                                        "maxUnavailable": "25%"}}}}
    assert rollout.observed_rolling_update(percent) is None  # not ours: the write sets ours


@pytest.mark.parametrize(("replicas", "minimum"), [(0, 0), (1, 0), (2, 1), (5, 1)])
def test_disruption_budget_keeps_one_replica_from_two(replicas: int, minimum: int) -> None:
    pool = {"metadata": {"name": "res-h100", "namespace": "ns", "labels": {"a": "b"},
                         "ownerReferences": [{"kind": "MTPInference", "uid": "u"}]},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"x": "y"}}}}
    budget = builders.pool_disruption_budget(pool)
    assert (budget["apiVersion"], budget["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert budget["metadata"]["name"] == "res-h100"
    assert budget["metadata"]["ownerReferences"] == pool["metadata"]["ownerReferences"]
    assert budget["spec"] == {"minAvailable": minimum, "selector": {"matchLabels": {"x": "y"}}}


# ---- where a tuning canary runs (issue 37 item 4) ----------------------------------------


def _room(allocatable: int, requested: int, largest: int = 8) -> rollout.ProductRoom:
    return rollout.ProductRoom("NVIDIA-H100-80GB-HBM3", allocatable, requested, largest)


def test_a_canary_goes_beside_the_pool_only_where_a_slot_is_spare() -> None:
    # 3 nodes x 8 GPUs, a pool of 2 x 8: one node spare
    beside = rollout.canary_placement(_room(24, 16), 8, 2)
    assert beside.beside_pool and beside.capacity_cost.startswith("none:")
    assert "8 of 24 GPUs" in beside.capacity_cost and "8 used" in beside.capacity_cost
    # 7 GPUs spare over the product but a canary of 8: no slot
    short = rollout.canary_placement(_room(24, 17), 8, 2)
    assert not short.beside_pool
    assert short.capacity_cost == (
        "1 of 2 replicas while the canary loads and runs (1 serve): no spare slot on "
        "NVIDIA-H100-80GB-HBM3 (7 of 24 GPUs free of pools and canaries, 8 needed)")
    # enough spare GPUs in all, but no single node holds 8
    assert not rollout.canary_placement(_room(24, 8, largest=4), 8, 2).beside_pool


def test_the_resource_or_host_network_keep_the_canary_in_a_replica() -> None:
    room = _room(32, 8)
    assert not rollout.canary_placement(room, 1, 4, spare_slot=False).beside_pool
    host = rollout.canary_placement(room, 1, 4, host_network=True)
    assert not host.beside_pool and host.capacity_cost.startswith("1 of 4 replicas")


def test_canaries_on_other_pods_count_against_the_room() -> None:
    node = GPUNode("n1", "NVIDIA-H100-80GB-HBM3", 8, {})
    assert rollout.product_room("NVIDIA-H100-80GB-HBM3", [node], [], other_gpus=3).spare_gpus == 5
