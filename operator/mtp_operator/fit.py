"""Does the model fit a GPU product, and on how many nodes? Pure arithmetic, no I/O.

Inputs per product: the GPUs of a node (allocatable `nvidia.com/gpu`), the memory of one of
them (`nvidia.com/gpu.memory`, MiB, as NVIDIA GPU Feature Discovery labels it; a MIG slice or
a shared GPU counts with its slice's memory) and the spec's `fit` block (weights in GiB,
headroom, most nodes per replica). A replica's GPUs are `tensorParallelSize`; weights may
fill at most (1 - headroom) of each GPU's memory.

- the replica's GPUs hold the weights and fit one node: **OneNode**, a Deployment pool;
- they hold the weights but span nodes (tensorParallelSize above a node's GPUs, a multiple of
  it), or they do not hold them but fill whole nodes: **MultiNode**, N pods of a node's GPUs
  each (a LeaderWorkerSet group), with pipeline stages added over whole nodes until the
  weights fit (pipeline_parallel_size = N x gpus per node / tensorParallelSize);
- otherwise (more than `maxNodesPerReplica` nodes, a replica of part of a node too small, a
  tensorParallelSize that does not split over the nodes, fewer schedulable nodes than a
  replica needs): **DoesNotFit**, with the numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mtp_operator.api.v1alpha1 import FitSpec, FitVerdict

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU (GFD)
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"  # GFD, GPU sharing: pods per physical GPU
MIB_PER_GIB = 1024
# GFD's MIG product names end with the slice's profile, e.g. A100-SXM4-40GB-MIG-1g.5gb
_MIG_PROFILE = re.compile(r"-MIG-\d+g\.(\d+)gb", re.IGNORECASE)


def _positive_int(value: str | None) -> int | None:
    try:
        n = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def gpu_memory_mib(labels: Mapping[str, str], product: str) -> int | None:
    """The memory one allocatable `nvidia.com/gpu` of a node gives a pod, in MiB, or None when
    its labels do not say.

    - `nvidia.com/gpu.memory` is the GPU's memory (GFD; under MIG strategy `single` the
      slice's);
    - a MIG slice named in the product (`...-MIG-1g.5gb`) gives at most its profile's memory
      (5 GiB), should the label name the whole card;
    - a shared GPU (time-slicing, `nvidia.com/gpu.replicas` = R pods on one GPU) gives each
      pod 1/R of it: the pods' weights must all fit the one GPU.
    """
    memory = _positive_int(labels.get(GPU_MEMORY_LABEL))
    mig = _MIG_PROFILE.search(product)
    if mig is not None:
        slice_mib = int(mig.group(1)) * MIB_PER_GIB
        memory = slice_mib if memory is None else min(memory, slice_mib)
    if memory is None:
        return None
    replicas = _positive_int(labels.get(GPU_REPLICAS_LABEL)) or 1
    return memory // replicas


@dataclass(frozen=True)
class ProductShape:
    """What fit reads of one product's schedulable nodes (those the spec may use)."""

    product: str
    allocatable: tuple[int, ...]  # allocatable nvidia.com/gpu of each node
    gpu_memory_mib: int | None  # the smallest per-GPU memory over the nodes (None: no label)

    @property
    def gpus_per_node(self) -> int:
        return max(self.allocatable, default=0)

    def nodes_with(self, gpus: int) -> int:
        return sum(1 for a in self.allocatable if a >= gpus)


def shape_of(
    product: str, nodes: Iterable[tuple[int, Mapping[str, str]]]
) -> ProductShape:
    """A product's shape from its nodes' (allocatable GPUs, labels)."""
    alloc: list[int] = []
    memories: list[int] = []
    unknown = False
    for gpus, labels in nodes:
        alloc.append(gpus)
        m = gpu_memory_mib(labels, product)
        if m is None:
            unknown = True
        else:
            memories.append(m)
    memory = None if unknown or not memories else min(memories)
    return ProductShape(product, tuple(alloc), memory)


@dataclass(frozen=True)
class Fit:
    """One product's verdict. `nodes` pods of `gpus_per_pod` GPUs make one replica."""

    product: str
    verdict: FitVerdict
    nodes: int = 1
    gpus_per_pod: int = 0
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    message: str = ""
    # a refusal the spec and the GPU alone cause (memory, parallelism): an existing pool of
    # the product is removed; False for too few schedulable nodes right now (kept as it runs)
    permanent: bool = False
    gpu_memory_mib: int | None = None
    gpus_per_node: int = 0

    @property
    def placeable(self) -> bool:
        return self.verdict != "DoesNotFit"


def _gib(mib: float) -> float:
    return mib / MIB_PER_GIB


def _fmt(gib: float) -> str:
    return f"{gib:,.0f}" if gib >= 10 else f"{gib:,.1f}"


def decide(
    fit: FitSpec | None, model: str, tensor_parallel_size: int, shape: ProductShape
) -> Fit:
    """The verdict for one product (see the module's docstring)."""
    tp, g = tensor_parallel_size, shape.gpus_per_node
    base = {"product": shape.product, "gpu_memory_mib": shape.gpu_memory_mib, "gpus_per_node": g}
    if fit is None or shape.gpu_memory_mib is None:
        # today's rule: a node with tensorParallelSize GPUs
        why = (
            "not checked: spec.fit is not set"
            if fit is None
            else f"not checked: its nodes have no {GPU_MEMORY_LABEL} label"
        )
        if shape.nodes_with(tp) == 0:
            return Fit(
                **base, verdict="DoesNotFit", gpus_per_pod=tp, tensor_parallel_size=tp,
                message=f"no schedulable node has {tp} allocatable nvidia.com/gpu",
            )
        return Fit(**base, verdict="NotChecked", gpus_per_pod=tp, tensor_parallel_size=tp,
                   message=why)

    gpu_gib = _gib(shape.gpu_memory_mib)
    usable = gpu_gib * (1 - fit.headroom)  # for weights, per GPU
    weights = fit.weights_gib
    name = shape.product
    need = (
        f"{model} needs ~{_fmt(weights)} GiB of weights"
        + (f" (+{fit.headroom:.0%} headroom: {_fmt(weights / (1 - fit.headroom))} GiB)"
           if fit.headroom else "")
    )

    def refuse(why: str, permanent: bool = True) -> Fit:
        return Fit(**base, verdict="DoesNotFit", gpus_per_pod=min(tp, g),
                   tensor_parallel_size=tp, message=f"{need}; {why}", permanent=permanent)

    if g == 0:
        return refuse(f"no schedulable node of {name} has an allocatable GPU", permanent=False)
    if tp <= g:
        if weights <= tp * usable:
            if shape.nodes_with(tp) == 0:
                return refuse(f"no schedulable node has {tp} allocatable GPUs", permanent=False)
            return Fit(
                **base, verdict="OneNode", nodes=1, gpus_per_pod=tp, tensor_parallel_size=tp,
                message=f"{tp} x {name} = {_fmt(tp * gpu_gib)} GiB: one node",
            )
        if tp < g:
            hint = (
                f"; a whole node ({g} x {name} = {_fmt(g * gpu_gib)} GiB) would: raise "
                "tensorParallelSize"
                if weights <= g * usable
                else ""
            )
            return refuse(
                f"tensorParallelSize {tp} x {name} = {_fmt(tp * gpu_gib)} GiB does not hold "
                f"it{hint}"
            )
    elif tp % g:
        return refuse(
            f"tensorParallelSize {tp} does not split over nodes of {g} x {name} "
            f"(a multiple of {g} does)"
        )
    # whole nodes: tp/g nodes per pipeline stage, stages added until the weights fit
    per_stage = max(tp // g, 1)
    stages = max(1, math.ceil(weights / (tp * usable) - 1e-9))
    nodes = per_stage * stages
    node_gib = g * gpu_gib
    if nodes > fit.max_nodes_per_replica:
        most = fit.max_nodes_per_replica
        return refuse(
            f"{g} x {name} = {_fmt(node_gib)} GiB a node, {nodes} nodes needed, "
            f"fit.maxNodesPerReplica {most} ({_fmt(most * node_gib)} GiB)"
        )
    available = shape.nodes_with(g)
    if available < nodes:
        return refuse(
            f"a replica spans {nodes} nodes of {g} x {name}; {available} schedulable",
            permanent=False,
        )
    if nodes == 1:
        return Fit(
            **base, verdict="OneNode", nodes=1, gpus_per_pod=tp, tensor_parallel_size=tp,
            message=f"{tp} x {name} = {_fmt(tp * gpu_gib)} GiB: one node",
        )
    return Fit(
        **base, verdict="MultiNode", nodes=nodes, gpus_per_pod=g, tensor_parallel_size=tp,
        pipeline_parallel_size=stages,
        message=f"{nodes} nodes of {g} x {name} = {_fmt(nodes * node_gib)} GiB "
        f"(tensor {tp} x pipeline {stages})",
    )


def summary(fits: Iterable[Fit], short: Mapping[str, str]) -> str:
    """`status.fitSummary`: nodes per replica by product, `no` for a refused one."""
    parts = []
    for f in fits:
        label = short.get(f.product, f.product)
        value = "no" if not f.placeable else ("?" if f.verdict == "NotChecked" else f.nodes)
        parts.append(f"{label}:{value}")
    return " ".join(parts)
