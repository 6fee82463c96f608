"""How a pool's pods are replaced when its pod template changes (a change of K is always a
restart: vLLM cannot change K while it runs). Pure: the nodes and the pools come in.

Surge when there is room: a rollout starts the new pod first and removes an old one only once
the new one is Ready (`maxSurge: 1, maxUnavailable: 0`) when the product has a spare slot,
GPUs for one more pod that no pool of the operator requests; otherwise one old pod goes first
(`maxSurge: 0, maxUnavailable: 1`, the pool serves with one replica less while the new one
loads; a 1-replica pool is down for that time).

What the operator counts: the allocatable `nvidia.com/gpu` of the product's schedulable nodes,
and the GPUs its own pool Deployments request there (replicas x GPUs per pod, every resource).
GPU pods of other workloads are not seen (the operator does not watch every pod): where they
hold the "spare" GPUs, the surge pod waits Pending while the old pods keep serving.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mtp_operator.naming import GPU_RESOURCE
from mtp_operator.planning import GPUNode
from mtp_runtime.vllm_command import DEFAULT_PORT, EXPORTER_PORT

REASON_POOL_ROLLOUT = "PoolRollout"  # the Event saying how a pool's pods are replaced
SURGE = {"maxSurge": 1, "maxUnavailable": 0}
NO_SURGE = {"maxSurge": 0, "maxUnavailable": 1}


@dataclass(frozen=True)
class ProductRoom:
    """One GPU product's GPUs as the operator sees them."""

    product: str
    allocatable_gpus: int  # over the product's schedulable nodes
    requested_gpus: int  # by the operator's pool Deployments of the product
    largest_node_gpus: int  # the most allocatable GPUs of one schedulable node

    @property
    def spare_gpus(self) -> int:
        return max(0, self.allocatable_gpus - self.requested_gpus)

    def holds(self, gpus: int) -> bool:
        """Whether one more pod of `gpus` GPUs fits: spare GPUs enough, on one node."""
        return self.largest_node_gpus >= gpus and self.spare_gpus >= gpus


def pod_gpus(deploy: Mapping[str, Any]) -> int:
    """The `nvidia.com/gpu` one pod of `deploy` asks for (limits, else requests; 0 if none)."""
    spec = ((deploy.get("spec") or {}).get("template") or {}).get("spec") or {}
    total = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(GPU_RESOURCE)
        if value is None:
            value = (resources.get("requests") or {}).get(GPU_RESOURCE)
        try:
            total += int(str(value)) if value is not None else 0
        except ValueError:
            continue
    return total


def requested_gpus(deploy: Mapping[str, Any]) -> int:
    """GPUs `deploy` requests at its desired size: replicas x GPUs per pod."""
    replicas = (deploy.get("spec") or {}).get("replicas")
    return (replicas if isinstance(replicas, int) else 1) * pod_gpus(deploy)


def product_room(product: str, nodes: Iterable[GPUNode],
                 pools: Iterable[Mapping[str, Any]], other_gpus: int = 0) -> ProductRoom:
    """`product`'s room: `nodes` (all GPU nodes; others' products are skipped), `pools` the
    operator's pool Deployments of that product, of every resource, and `other_gpus` more
    that the operator's own pods request there (tuning canaries)."""
    allocatable = largest = 0
    for n in nodes:
        if n.product == product and n.schedulable:
            allocatable += n.allocatable_gpus
            largest = max(largest, n.allocatable_gpus)
    return ProductRoom(product, allocatable,
                       sum(requested_gpus(d) for d in pools) + other_gpus, largest)


@dataclass(frozen=True)
class SurgeDecision:
    surge: bool
    message: str  # for the PoolUpdated Event

    @property
    def rolling_update(self) -> dict[str, int]:
        return dict(SURGE if self.surge else NO_SURGE)


def surge_decision(room: ProductRoom, gpus_per_pod: int, replicas: int,
                   host_network: bool = False) -> SurgeDecision:
    """Whether a rollout of a pool of `replicas` pods (`gpus_per_pod` each) on `room`'s product
    starts its new pod before removing an old one. A hostNetwork pool never surges: the new
    pod cannot take the old one's ports on its node, and which nodes hold the pool's pods is
    not known here."""
    if replicas < 1:
        return SurgeDecision(False, "no replica to replace")
    need = max(1, gpus_per_pod)
    lost = ("the pool is down until the new pod is Ready" if replicas == 1 else
            f"{replicas - 1} of {replicas} replicas serve until the new pod is Ready")
    if host_network:
        return SurgeDecision(False, f"hostNetwork: no surge (ports {DEFAULT_PORT} and "
                             f"{EXPORTER_PORT} are the node's), one old pod stops first, {lost}")
    if not room.holds(need):
        return SurgeDecision(False, f"no spare slot on {room.product} ({room.spare_gpus} of "
                             f"{room.allocatable_gpus} GPUs not requested by pools, {need} "
                             f"needed): one old pod stops first, {lost}")
    return SurgeDecision(True, f"surge: a spare slot on {room.product} ({room.spare_gpus} of "
                         f"{room.allocatable_gpus} GPUs free of pools, {need} needed), each "
                         "new pod starts before an old one leaves")


@dataclass(frozen=True)
class CanaryPlacement:
    beside_pool: bool  # on a spare slot, the pool keeps every replica
    capacity_cost: str  # status trial.capacityCost and the TuningTrialStarted Event


def canary_placement(room: ProductRoom, gpus_per_pod: int, replicas: int,
                     host_network: bool = False, spare_slot: bool = True) -> CanaryPlacement:
    """Where a tuning canary of a pool of `replicas` runs (issue 37): on a spare slot of the
    product beside the full pool when there is one (`room` counts the pool at its full size
    and every canary already running) and the resource allows it (`spare_slot`, the spec's
    canaryPlacement); else in one of the pool's replicas. A hostNetwork canary never goes
    beside: it would need a node where no pod of the pool holds the ports, which is not
    known here."""
    need = max(1, gpus_per_pod)
    given = (f"1 of {replicas} replicas while the canary loads and runs "
             f"({replicas - 1} serve)")
    if not spare_slot:
        return CanaryPlacement(False, f"{given}: canaryPlacement FromPool")
    if host_network:
        return CanaryPlacement(False, f"{given}: hostNetwork pools run the canary in a replica")
    if not room.holds(need):
        return CanaryPlacement(False, f"{given}: no spare slot on {room.product} "
                               f"({room.spare_gpus} of {room.allocatable_gpus} GPUs free of "
                               f"pools and canaries, {need} needed)")
    return CanaryPlacement(True, f"none: the canary runs on a spare slot beside the pool's "
                           f"{replicas} replicas ({room.spare_gpus} of {room.allocatable_gpus} "
                           f"GPUs on {room.product} free of pools and canaries, {need} used)")


def min_available(replicas: int) -> int:
    """The pool's PodDisruptionBudget: voluntary evictions keep one replica serving when the
    pool has two or more; a 1-replica pool is not protected (a budget of 1 would block node
    drains for good)."""
    return 1 if replicas >= 2 else 0


def rolls_pods(desired: Mapping[str, Any], observed: Mapping[str, Any] | None,
               annotation: str) -> bool:
    """Whether writing `desired` over `observed` replaces the pool's pods: its pod template's
    settings digest (`annotation`) changes. A scale or a new pool rolls nothing."""
    if observed is None:
        return False

    def digest(deploy: Mapping[str, Any]) -> Any:
        template = (deploy.get("spec") or {}).get("template") or {}
        return ((template.get("metadata") or {}).get("annotations") or {}).get(annotation)

    return digest(desired) != digest(observed)


def with_rolling_update(desired: Mapping[str, Any], rolling_update: Mapping[str, int]
                        ) -> dict[str, Any]:
    """A copy of the Deployment `desired` (shared: the rendered set is reused) with this
    rollingUpdate; the rest is shared with `desired`."""
    spec = dict(desired["spec"])
    spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": dict(rolling_update)}
    return {**desired, "spec": spec}


def observed_rolling_update(observed: Mapping[str, Any] | None) -> dict[str, int] | None:
    """The rollingUpdate a watched Deployment has (to keep it on a write that rolls nothing:
    a rollout under way keeps the strategy it began with)."""
    strategy = ((observed or {}).get("spec") or {}).get("strategy") or {}
    ru = strategy.get("rollingUpdate")
    if not isinstance(ru, Mapping):
        return None
    out = {k: ru[k] for k in ("maxSurge", "maxUnavailable") if isinstance(ru.get(k), int)}
    return out if len(out) == 2 else None
