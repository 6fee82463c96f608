"""Which pools a resource gets, and with which K. Pure: nodes and spec in, pool plans out.

One pool per GPU product found on schedulable nodes that can hold one replica
(`nvidia.com/gpu` allocatable ≥ tensorParallelSize, and the resource's nodeSelector matches),
filtered by `spec.gpuProducts` when set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mtp_operator.api.v1alpha1 import MTPInferenceSpec, PoolSource
from mtp_operator.naming import GPU_PRODUCT_LABEL, GPU_RESOURCE
from mtp_runtime.gpu_profiles import KError, KRequest, resolve_k
from mtp_runtime.problems import Problem, problems_text
from mtp_runtime.vllm_command import ServeSettings, problems


@dataclass(frozen=True)
class GPUNode:
    name: str
    product: str
    allocatable_gpus: int
    labels: Mapping[str, str]
    schedulable: bool = True


def gpu_node_from_body(body: Mapping[str, Any]) -> GPUNode | None:
    """A Node object → GPUNode, or None for nodes without a GPU product label."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    product = labels.get(GPU_PRODUCT_LABEL)
    if not product:
        return None
    allocatable = (body.get("status") or {}).get("allocatable") or {}
    try:
        gpus = int(str(allocatable.get(GPU_RESOURCE, "0")))
    except ValueError:
        gpus = 0
    spec = body.get("spec") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (body.get("status") or {}).get("conditions") or []
    )
    return GPUNode(
        name=meta.get("name", ""),
        product=product,
        allocatable_gpus=gpus,
        labels=dict(labels),
        schedulable=not spec.get("unschedulable", False) and ready,
    )


def fitting_products(spec: MTPInferenceSpec, nodes: Iterable[GPUNode]) -> list[str]:
    """GPU products with at least one schedulable node that can hold a replica, sorted."""
    selector = spec.node_selector or {}
    products = {
        n.product
        for n in nodes
        if n.schedulable
        and n.allocatable_gpus >= spec.tensor_parallel_size
        and all(n.labels.get(k) == v for k, v in selector.items())
    }
    if spec.gpu_products is not None:
        products &= set(spec.gpu_products)
    return sorted(products)


def no_fit_problem(spec: MTPInferenceSpec) -> Problem:
    """Why no pool can be placed, naming the field most likely to blame."""
    field = "gpuProducts" if spec.gpu_products is not None else "tensorParallelSize"
    message = f"no schedulable node has {spec.tensor_parallel_size} allocatable nvidia.com/gpu"
    if spec.gpu_products is not None:
        message += f" among gpuProducts {spec.gpu_products}"
    if spec.node_selector:
        message += f" and matches nodeSelector {spec.node_selector}"
    return Problem(field, message)


@dataclass(frozen=True)
class PoolPlan:
    gpu_product: str
    k: int
    source: PoolSource
    reason: str
    serve: ServeSettings
    k_mode: str  # "auto" | "fixed" (see mtp_runtime.pool_config)


class PlanError(ValueError):
    """The spec cannot be served as written; `problems` are (field, message) pairs."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__(problems_text(problems))


def k_request(spec: MTPInferenceSpec) -> KRequest:
    s = spec.speculative
    return KRequest(
        num_speculative_tokens=s.num_speculative_tokens,
        profiles=s.profiles,
        max_speculative_tokens=s.max_speculative_tokens,
        mtp_layers=s.mtp_layers,
    )


def serve_settings(spec: MTPInferenceSpec, k: int) -> ServeSettings:
    return ServeSettings(
        model=spec.model,
        num_speculative_tokens=k,
        method=spec.speculative.method,
        tensor_parallel_size=spec.tensor_parallel_size,
        max_model_len=None if spec.max_model_len is None else str(spec.max_model_len),
        reasoning_parser=spec.reasoning_parser,
        served_model_name=spec.served_model_name,
        model_source=spec.model_source,
        mtp_layers=spec.speculative.mtp_layers,
        extra_args=tuple(spec.extra_args or ()),
    )


def plan_pool(
    spec: MTPInferenceSpec,
    product: str,
    cluster_profiles: Mapping[str, int] | None = None,
    rollback_k: int | None = None,
) -> PoolPlan:
    """The settings one pool runs with. A rollback pin lowers K; it never raises it above
    what the spec asks for now."""
    try:
        resolution = resolve_k(product, k_request(spec), cluster_profiles)
    except KError as err:
        raise PlanError([(err.field, err.message)]) from err
    k, source, reason = resolution.k, resolution.source, resolution.reason
    explicit = spec.speculative.num_speculative_tokens != "auto"
    if rollback_k is not None and rollback_k < k:
        k, source, reason = rollback_k, "rollback", f"rolled back from K={k}"
    serve = serve_settings(spec, k)
    serve_problems = problems(serve)
    if serve_problems:
        raise PlanError(serve_problems)
    mode = "fixed" if explicit or source == "rollback" else "auto"
    return PoolPlan(product, k, source, reason, serve, mode)


def validate_spec(spec: MTPInferenceSpec) -> list[Problem]:
    """Problems the API server's schema cannot see, checked without any cluster state.

    Every speculative.profiles entry is checked too (as a pool of the GPU it names would plan
    it), so a bad entry is reported whether or not the cluster has that GPU right now.
    """
    try:
        plan_pool(spec, "validation-probe")
    except PlanError as err:
        return err.problems
    profile_problems: list[Problem] = []
    for key, k in sorted((spec.speculative.profiles or {}).items()):
        if k < 0:
            profile_problems.append(
                Problem(f"speculative.profiles[{key}]", f"{k}: K must be 0 (off) or more")
            )
            continue
        try:
            plan_pool(spec, key)
        except PlanError as err:
            profile_problems += [p for p in err.problems if p not in profile_problems]
    return profile_problems
