"""Which pools a resource gets, and with which K. Pure: nodes and spec in, pool plans out.

One pool per GPU product found on schedulable nodes that can hold one replica
(`nvidia.com/gpu` allocatable ≥ tensorParallelSize, and the resource's nodeSelector matches),
filtered by `spec.gpuProducts` when set. A pool whose product has no such node right now
(cordoned, NotReady, drained, GPUs not allocatable) is kept as it runs (`pool_fates`); it is
removed only when the spec excludes it or no node carries the product for a grace period.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from mtp_operator.api.v1alpha1 import MTPInferenceSpec, PoolSource
from mtp_operator.fit import Fit, ProductShape, decide, shape_of
from mtp_operator.naming import GPU_PRODUCT_LABEL, GPU_RESOURCE, pool_key
from mtp_runtime.gpu_profiles import KError, KRequest, bounded_schedule, resolve_k
from mtp_runtime.problems import Problem, problems_text
from mtp_runtime.vllm_command import ServeSettings, problems


@dataclass(frozen=True)
class GPUNode:
    name: str
    product: str
    allocatable_gpus: int
    labels: Mapping[str, str]
    schedulable: bool = True
    capacity_gpus: int = 0  # nvidia.com/gpu capacity: the hardware, steadier than allocatable

    @property
    def gpus(self) -> int:
        """The node's GPUs, whether or not they can be allocated right now."""
        return max(self.capacity_gpus, self.allocatable_gpus)


def _gpu_count(resources: Mapping[str, Any]) -> int:
    try:
        return max(0, int(str(resources.get(GPU_RESOURCE, "0"))))
    except ValueError:
        return 0


def gpu_node_from_body(body: Mapping[str, Any]) -> GPUNode | None:
    """A Node object → GPUNode, or None for nodes without a GPU product label or without any
    GPU (capacity and allocatable 0): such a node is no node of that product."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    product = labels.get(GPU_PRODUCT_LABEL)
    if not product:
        return None
    status = body.get("status") or {}
    gpus = _gpu_count(status.get("allocatable") or {})
    capacity = max(_gpu_count(status.get("capacity") or {}), gpus)
    if capacity == 0:
        return None
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
        capacity_gpus=capacity,
    )


class NodeInventory:
    """The GPU nodes as planning reads them, grouped once: every pass of every resource plans
    against the same nodes until one changes, and scanning them all per pass made planning
    O(resources x nodes) (1,000 resources on 500 nodes: ~0.2 ms a pass, tens of thousands of
    passes in a rollout). Build one per version of the nodes and pass it where nodes go."""

    def __init__(self, nodes: Iterable[GPUNode]) -> None:
        self.nodes: tuple[GPUNode, ...] = tuple(nodes)
        self.by_product: dict[str, list[GPUNode]] = {}
        # per product: the most allocatable GPUs of one schedulable node (-1: none schedulable)
        self.most_allocatable: dict[str, int] = {}
        for n in self.nodes:
            self.by_product.setdefault(n.product, []).append(n)
            best = self.most_allocatable.get(n.product, -1)
            if n.schedulable and n.allocatable_gpus > best:
                best = n.allocatable_gpus
            self.most_allocatable[n.product] = best

    @classmethod
    def of(cls, nodes: Iterable[GPUNode] | NodeInventory) -> NodeInventory:
        return nodes if isinstance(nodes, NodeInventory) else cls(nodes)

    def shapes(self, selector: Mapping[str, str] | None) -> dict[str, ProductShape]:
        """Per product, its schedulable nodes that match `selector` as fit reads them
        (allocatable GPUs, per-GPU memory); products without such a node are left out.
        Kept per selector: every resource with the same selector reads the same shapes."""
        memo: dict[tuple[tuple[str, str], ...], dict[str, ProductShape]]
        memo = self.__dict__.setdefault("_shapes", {})
        key = tuple(sorted((selector or {}).items()))
        if key not in memo:
            out = {}
            for product, of_product in self.by_product.items():
                matching = [
                    (n.allocatable_gpus, n.labels)
                    for n in of_product
                    if n.schedulable and all(n.labels.get(k) == v for k, v in key)
                ]
                if matching:
                    out[product] = shape_of(product, matching)
            memo[key] = out
        return memo[key]


def product_fits(
    spec: MTPInferenceSpec, nodes: Iterable[GPUNode] | NodeInventory
) -> dict[str, Fit]:
    """The fit verdict (fit.decide) of each GPU product the spec may use that has a
    schedulable node matching its nodeSelector, by product. Without spec.fit the verdict is
    today's rule (a node with tensorParallelSize allocatable GPUs), marked NotChecked."""
    inventory = NodeInventory.of(nodes)
    allowed = None if spec.gpu_products is None else set(spec.gpu_products)
    return {
        product: decide(spec.fit, spec.model, spec.tensor_parallel_size, shape)
        for product, shape in sorted(inventory.shapes(spec.node_selector).items())
        if allowed is None or product in allowed
    }


def fitting_products(
    spec: MTPInferenceSpec, nodes: Iterable[GPUNode] | NodeInventory
) -> list[str]:
    """GPU products with at least one schedulable node that can hold a replica, sorted
    (with spec.fit: products the model fits, on one node or a group of nodes)."""
    inventory = NodeInventory.of(nodes)
    if spec.fit is not None:
        return [p for p, f in product_fits(spec, inventory).items() if f.placeable]
    selector = spec.node_selector or {}
    if selector:
        products = {
            n.product
            for n in inventory.nodes
            if n.schedulable
            and n.allocatable_gpus >= spec.tensor_parallel_size
            and all(n.labels.get(k) == v for k, v in selector.items())
        }
    else:
        products = {
            p for p, most in inventory.most_allocatable.items()
            if most >= spec.tensor_parallel_size
        }
    if spec.gpu_products is not None:
        products &= set(spec.gpu_products)
    return sorted(products)


RETAINED_NO_SCHEDULABLE_NODE = "NoSchedulableNode"
RETAINED_PRODUCT_GONE = "ProductGone"


@dataclass(frozen=True)
class PoolFate:
    """What happens to an existing pool whose product no node fits right now."""

    gpu_product: str
    action: Literal["retain", "remove"]
    reason: str  # NoSchedulableNode | ProductGone (retain), ProductGone | ExcludedBySpec (remove)
    message: str
    gone_since: datetime | None = None  # first seen without any node of its product
    remove_at: datetime | None = None  # a retained ProductGone pool's deadline
    traffic_class: str | None = None  # a class pool's class (spec.speculative.classes)

    @property
    def key(self) -> str:
        """The pool's identity (naming.pool_key): the product, or `product/class`."""
        return pool_key(self.gpu_product, self.traffic_class)


def _excluded_by_spec(spec: MTPInferenceSpec, product: str, nodes: list[GPUNode]) -> str | None:
    """Why the spec itself rules out every node of `product` (a user's edit), or None."""
    if spec.gpu_products is not None and product not in spec.gpu_products:
        return "gpuProducts no longer lists it"
    selector = spec.node_selector or {}
    matching = [n for n in nodes if all(n.labels.get(k) == v for k, v in selector.items())]
    if not matching:
        return f"no node of this product matches nodeSelector {selector}"
    if spec.fit is not None:  # the model does not fit this GPU, whatever its nodes do now
        fit = decide(
            spec.fit, spec.model, spec.tensor_parallel_size,
            shape_of(product, [(n.gpus, n.labels) for n in matching]),
        )
        return fit.message if not fit.placeable and fit.permanent else None
    if all(n.gpus < spec.tensor_parallel_size for n in matching):
        return f"no node of this product has {spec.tensor_parallel_size} GPUs (tensorParallelSize)"
    return None


def pool_fates(
    spec: MTPInferenceSpec,
    nodes: Iterable[GPUNode] | NodeInventory,
    existing: Iterable[str],
    fitting: Iterable[str],
    gone_since: Mapping[str, datetime],
    now: datetime,
    grace_seconds: float,
) -> list[PoolFate]:
    """The fate of each existing pool whose product is not among `fitting`, sorted.

    - the spec rules the product out (gpuProducts, nodeSelector, tensorParallelSize above every
      node's GPU capacity): removed at once, it is the user's edit;
    - nodes of the product exist but none can take a replica now (cordoned, NotReady,
      drained, GPUs not allocatable): retained as it runs, for as long as that lasts;
    - no node carries the product (label removed or changed, node deleted, GPU capacity 0):
      retained until `grace_seconds` after `gone_since`, then removed.
    """
    fit = set(fitting)
    out: list[PoolFate] = []
    unfit = sorted(set(existing) - fit)
    by_product = NodeInventory.of(nodes).by_product if unfit else {}
    for product in unfit:
        of_product = by_product.get(product, [])
        if of_product:
            why = _excluded_by_spec(spec, product, of_product)
            if why is not None:
                out.append(PoolFate(product, "remove", "ExcludedBySpec", why))
            else:
                out.append(
                    PoolFate(
                        product,
                        "retain",
                        RETAINED_NO_SCHEDULABLE_NODE,
                        f"no schedulable node of this product has {spec.tensor_parallel_size} "
                        "allocatable nvidia.com/gpu (cordoned, NotReady, drained or GPUs not "
                        "allocatable); pods keep running",
                    )
                )
            continue
        since = gone_since.get(product) or now
        due = since + timedelta(seconds=grace_seconds)
        if now >= due:
            out.append(
                PoolFate(
                    product,
                    "remove",
                    RETAINED_PRODUCT_GONE,
                    f"no node has carried this GPU product for {grace_seconds:g}s",
                    since,
                )
            )
        else:
            out.append(
                PoolFate(
                    product,
                    "retain",
                    RETAINED_PRODUCT_GONE,
                    "no node carries this GPU product any more; the pool is removed at "
                    f"{due.strftime('%Y-%m-%dT%H:%M:%SZ')} unless one returns",
                    since,
                    due,
                )
            )
    return out


def no_fit_problem(spec: MTPInferenceSpec, fits: Mapping[str, Fit] | None = None) -> Problem:
    """Why no pool can be placed, naming the field most likely to blame."""
    refused = [f for f in (fits or {}).values() if not f.placeable]
    if spec.fit is not None and refused:
        return Problem(
            "fit.weightsGiB", "; ".join(f"{f.product}: {f.message}" for f in refused)
        )
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
    fit: Fit | None = None  # spec.fit's verdict for the product (nodes per replica)

    @property
    def nodes(self) -> int:
        """Pods (one per node) of one replica: above 1, a LeaderWorkerSet group."""
        return self.fit.nodes if self.fit is not None and self.fit.placeable else 1

    traffic_class: str | None = None  # a class pool's class (spec.speculative.classes)

    @property
    def key(self) -> str:
        """The pool's identity (naming.pool_key): the product, or `product/class`."""
        return pool_key(self.gpu_product, self.traffic_class)


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
        model=spec.model,
        method=s.method,
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
        batch_size_schedule=tuple(
            (r.min_batch_size, r.max_batch_size, r.num_speculative_tokens)
            for r in spec.speculative.batch_size_schedule or ()
        ),
    )


def data_parallel_size(spec: MTPInferenceSpec) -> tuple[int, int | None]:
    """(VLLM_DP_SIZE in the pod's env, its index in spec.env); (1, None) when unset or not a
    number. The DP flags are reserved in extraArgs, so the env is the one way to set it."""
    for i, item in enumerate(spec.env or []):
        if isinstance(item, Mapping) and item.get("name") == "VLLM_DP_SIZE":
            try:
                return int(str(item.get("value", "1")).strip()), i
            except ValueError:
                return 1, None
    return 1, None


def plan_pool(
    spec: MTPInferenceSpec,
    product: str,
    cluster_profiles: Mapping[str, int] | None = None,
    rollback_k: int | None = None,
    tuned_k: int | None = None,
    fit: Fit | None = None,
) -> PoolPlan:
    """The settings one pool runs with. A K adopted by tuning (one of the spec's candidates)
    replaces the spec's; a rollback pin lowers K, never raising it above what runs now."""
    try:
        resolution = resolve_k(product, k_request(spec), cluster_profiles)
    except KError as err:
        raise PlanError([(err.field, err.message)]) from err
    k, source, reason = resolution.k, resolution.source, resolution.reason
    explicit = spec.speculative.num_speculative_tokens != "auto"
    if tuned_k is not None and tuned_k != k:
        k, source, reason = tuned_k, "tuned", f"tuned from K={k}: measured best"
    if rollback_k is not None and rollback_k < k:
        k, source, reason = rollback_k, "rollback", f"rolled back from K={k}"
    serve = serve_settings(spec, k)
    if fit is not None and fit.placeable and fit.nodes > 1:  # a LeaderWorkerSet group
        serve = dataclasses.replace(
            serve, pipeline_parallel_size=fit.pipeline_parallel_size, nnodes=fit.nodes
        )
    if resolution.schedule and not serve.batch_size_schedule and source != "tuned" \
            and spec.speculative.tuning.mode == "Off" and data_parallel_size(spec)[0] <= 1:
        # a measured profile's K per batch-size band (a rollback caps every band); a pool
        # being tuned runs one K, which is what a tuning window can measure; vLLM 0.33 drops
        # a schedule under data parallelism (validation.data_parallel_problems)
        schedule = bounded_schedule(resolution.schedule, k, spec.speculative.mtp_layers)
        serve = dataclasses.replace(serve, batch_size_schedule=schedule)
    serve_problems = problems(serve)
    if serve_problems:
        raise PlanError(serve_problems)
    mode = "fixed" if explicit or source in ("rollback", "tuned") else "auto"
    return PoolPlan(product, k, source, reason, serve, mode, fit=fit)


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
