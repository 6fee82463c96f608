"""Where a tuning canary starts (issue 37): on a spare slot beside the full pool, or in one of
the pool's replicas. Decided once, when the tuner starts the trial, from what the operator
watches: the product's schedulable nodes, the pools of every resource on that product (the
pool being tuned counted at its full size, whatever its Deployment has now) and the canaries
already running there. The answer is recorded in the trial (status trial.besidePool and
trial.capacityCost) and held to the trial's end (tuning.state.canaries_taking_a_replica).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtp_operator import rollout
from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.control.ports import ClusterView
from mtp_operator.lws import pods_shape
from mtp_operator.naming import ANNOTATION_GPU_PRODUCT
from mtp_operator.tuning.state import tuning_of

Key = tuple[str, str]


def _product(meta_or_body: Mapping[str, Any]) -> str | None:
    meta = meta_or_body.get("metadata", meta_or_body) or {}
    return (meta.get("annotations") or {}).get(ANNOTATION_GPU_PRODUCT)


def canary_placement(view: ClusterView, key: Key, pool_key: str, product: str,
                     spec: MTPInferenceSpec, traffic_class: str | None = None,
                     ) -> rollout.CanaryPlacement:
    """The placement of a canary for pool `pool_key` (GPU `product`) of resource `key`."""
    per_pod = max(1, spec.tensor_parallel_size)
    pools: list[Mapping[str, Any]] = []
    other_gpus = 0  # canaries, and this pool while the watch does not show it yet
    for k in view.resource_keys():
        biggest_pod = 0  # a canary asks what a replica of its resource's pool asks
        for pk, dep in view.pool_deployments(k).items():
            if _product(dep) != product:
                continue
            shape = pods_shape(dep)
            biggest_pod = max(biggest_pod, rollout.pod_gpus(shape))
            if k == key and pk == pool_key:  # at full size: the choice must not flip once
                spec_ = dict(shape.get("spec") or {})  # the pool has given a replica up
                shape = {**shape, "spec": {**spec_, "replicas": spec.replicas}}
            pools.append(shape)
        canaries = sum(_product(meta) == product for meta in view.canary_pods(k).values())
        other_gpus += canaries * (biggest_pod or per_pod)
    if pool_key not in view.pool_deployments(key):  # not watched yet: count it as planned
        other_gpus += spec.replicas * per_pod
    room = rollout.product_room(product, view.gpu_nodes(), pools, other_gpus)
    spare = tuning_of(spec, traffic_class).canary_placement == "SpareSlot"
    return rollout.canary_placement(room, per_pod, spec.replicas, spec.host_network, spare)
