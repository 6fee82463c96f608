"""planning.py: which GPU products get a pool, and the K each pool runs with."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.planning import (
    GPUNode,
    NodeInventory,
    PlanError,
    fitting_products,
    gpu_node_from_body,
    no_fit_problem,
    plan_pool,
    pool_fates,
    validate_spec,
)
from mtp_runtime.vllm_command import build_argv

H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
A100 = "NVIDIA-A100-SXM4-80GB"
L40S = "NVIDIA-L40S"
MIG = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
SHARED = "NVIDIA-H200-SHARED"


def _spec(**fields: Any) -> MTPInferenceSpec:
    return MTPInferenceSpec.model_validate({"model": "org/model", **fields})


def _node_body(
    name: str,
    product: str | None,
    gpus: str | None = "8",
    ready: str | None = "True",
    unschedulable: bool = False,
    labels: dict[str, str] | None = None,
    capacity: str | None = None,
) -> dict[str, Any]:
    all_labels = dict(labels or {})
    if product is not None:
        all_labels["nvidia.com/gpu.product"] = product
    status: dict[str, Any] = {"allocatable": {"cpu": "64"}, "capacity": {"cpu": "64"}}
    if gpus is not None:
        status["allocatable"]["nvidia.com/gpu"] = gpus
    if capacity is not None:
        status["capacity"]["nvidia.com/gpu"] = capacity
    if ready is not None:
        status["conditions"] = [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": ready},
        ]
    return {
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": status,
    }


def _node(product: str, gpus: int = 8, schedulable: bool = True, **labels: str) -> GPUNode:
    return GPUNode(f"n-{product}-{gpus}", product, gpus, {**labels}, schedulable)


# ---- nodes ----------------------------------------------------------------------------------


def test_gpu_node_from_body() -> None:
    node = gpu_node_from_body(_node_body("a", H100, labels={"zone": "z1"}))
    assert node == GPUNode(
        "a", H100, 8, {"zone": "z1", "nvidia.com/gpu.product": H100}, schedulable=True,
        capacity_gpus=8,
    )


@pytest.mark.parametrize(
    ("body", "schedulable"),
    [
        (_node_body("a", H100, unschedulable=True), False),  # cordoned
        (_node_body("a", H100, ready="False"), False),  # NotReady
        (_node_body("a", H100, ready="Unknown"), False),  # lost contact
        (_node_body("a", H100, ready=None), False),  # no conditions yet
    ],
    ids=["cordoned", "not-ready", "unknown", "no-conditions"],
)
def test_unschedulable_or_not_ready_nodes(body: dict[str, Any], schedulable: bool) -> None:
    node = gpu_node_from_body(body)
    assert node is not None and node.schedulable is schedulable
    assert fitting_products(_spec(), [node]) == []


@pytest.mark.parametrize(
    ("gpus", "capacity", "want"),
    [(None, "8", 0), ("0", "8", 0), ("4", "8", 4), ("bogus", "8", 0), ("4", None, 4)],
)
def test_allocatable_gpus(gpus: str | None, capacity: str | None, want: int) -> None:
    node = gpu_node_from_body(_node_body("a", H100, gpus=gpus, capacity=capacity))
    assert node is not None and node.allocatable_gpus == want


@pytest.mark.parametrize(("gpus", "capacity"), [(None, None), ("0", "0"), ("bogus", "-1")])
def test_nodes_without_any_gpu_are_no_nodes_of_their_product(
    gpus: str | None, capacity: str | None
) -> None:
    # a GPU capacity of 0 takes the node out of the operator's view, like a removed label
    assert gpu_node_from_body(_node_body("a", H100, gpus=gpus, capacity=capacity)) is None


def test_cpu_nodes_are_ignored() -> None:
    assert gpu_node_from_body(_node_body("cpu", None, gpus=None)) is None
    assert gpu_node_from_body({"metadata": {"name": "bare"}}) is None
    assert gpu_node_from_body({}) is None


# ---- fitting products -----------------------------------------------------------------------


def test_tensor_parallel_size_against_allocatable() -> None:
    nodes = [_node(H100, 8), _node(A100, 4), _node(L40S, 2)]
    assert fitting_products(_spec(tensorParallelSize=1), nodes) == [A100, H100, L40S]
    assert fitting_products(_spec(tensorParallelSize=4), nodes) == [A100, H100]
    assert fitting_products(_spec(tensorParallelSize=8), nodes) == [H100]
    assert fitting_products(_spec(tensorParallelSize=16), nodes) == []


def test_one_fitting_node_is_enough_and_products_are_unique_and_sorted() -> None:
    nodes = [
        _node(H200, 2),
        _node(H200, 8, schedulable=False),
        _node(H200, 8),
        _node(H100, 8),
        _node(H100, 8),
    ]
    assert fitting_products(_spec(tensorParallelSize=8), nodes) == [H100, H200]
    # only the cordoned node would fit
    nodes = [_node(H200, 2), _node(H200, 8, schedulable=False)]
    assert fitting_products(_spec(tensorParallelSize=8), nodes) == []


def test_node_selector() -> None:
    nodes = [_node(H100, pool="a", zone="z1"), _node(H200, pool="b", zone="z1")]
    assert fitting_products(_spec(nodeSelector={"pool": "a"}), nodes) == [H100]
    assert fitting_products(_spec(nodeSelector={"zone": "z1"}), nodes) == [H100, H200]
    assert fitting_products(_spec(nodeSelector={"pool": "a", "zone": "z2"}), nodes) == []
    assert fitting_products(_spec(nodeSelector={"missing": "x"}), nodes) == []


def test_gpu_products_allow_list() -> None:
    nodes = [_node(H100), _node(H200), _node(A100), _node(L40S)]
    assert fitting_products(_spec(gpuProducts=[H100, H200]), nodes) == [H100, H200]
    # a listed product with no fitting node gets no pool; families are not expanded
    assert fitting_products(_spec(gpuProducts=["NVIDIA-B200", H200]), nodes) == [H200]
    assert fitting_products(_spec(gpuProducts=["H100"]), nodes) == []
    assert fitting_products(_spec(gpuProducts=[]), nodes) == []
    assert fitting_products(_spec(), nodes) == [A100, H100, H200, L40S]


def test_inventory_gives_the_products_the_definition_gives() -> None:
    """fitting_products over a NodeInventory (built once per version of the nodes) against
    the module's rule written out here: a product fits when one of its nodes is schedulable,
    has tensorParallelSize allocatable GPUs and carries every nodeSelector label, among
    gpuProducts when set. Random node sets and specs, the fast path (no selector) included."""
    import random

    rng = random.Random(7)
    products = [H100, H200, A100, L40S]
    for _ in range(400):
        nodes = [
            GPUNode(
                f"n{i}", rng.choice(products), rng.choice([0, 1, 2, 4, 8]),
                {k: rng.choice(["a", "b"]) for k in ("pool", "zone") if rng.random() < 0.7},
                rng.random() < 0.7,
            )
            for i in range(rng.randint(0, 12))
        ]
        fields: dict[str, Any] = {"tensorParallelSize": rng.choice([1, 2, 4, 8])}
        if rng.random() < 0.4:
            fields["nodeSelector"] = {"pool": rng.choice(["a", "b"])}
        if rng.random() < 0.3:
            fields["gpuProducts"] = rng.sample(products, rng.randint(0, 3))
        spec = _spec(**fields)
        selector = fields.get("nodeSelector", {})
        want = sorted(
            {
                n.product for n in nodes
                if n.schedulable and n.allocatable_gpus >= fields["tensorParallelSize"]
                and all(n.labels.get(k) == v for k, v in selector.items())
                and n.product in fields.get("gpuProducts", products)
            }
        )
        inventory = NodeInventory(nodes)
        assert fitting_products(spec, inventory) == want, (nodes, fields)
        assert fitting_products(spec, nodes) == want


def test_mig_and_shared_products_are_their_own_pools() -> None:
    nodes = [_node(MIG, 7), _node(SHARED, 4), _node(H200, 8)]
    assert fitting_products(_spec(), nodes) == [MIG, H200, SHARED]
    assert fitting_products(_spec(tensorParallelSize=8), nodes) == [H200]
    assert fitting_products(_spec(gpuProducts=[MIG]), nodes) == [MIG]


def test_fitting_products_from_node_bodies() -> None:
    bodies = [
        _node_body("cpu-1", None, gpus=None),
        _node_body("h100-1", H100),
        _node_body("h100-cordoned", H100, unschedulable=True),
        _node_body("a100-notready", A100, ready="False"),
        _node_body("l40s-busy", L40S, gpus="0", capacity="8"),
        _node_body("l40s-gone", L40S, gpus="0", capacity="0"),
    ]
    nodes = [n for n in map(gpu_node_from_body, bodies) if n is not None]
    assert len(nodes) == 4
    assert fitting_products(_spec(), nodes) == [H100]


def test_no_fit_problem_names_the_field() -> None:
    field, message = no_fit_problem(_spec(tensorParallelSize=16))
    assert field == "tensorParallelSize" and "16 allocatable nvidia.com/gpu" in message
    field, message = no_fit_problem(_spec(gpuProducts=["NVIDIA-B300"], nodeSelector={"a": "b"}))
    assert field == "gpuProducts" and "NVIDIA-B300" in message and "nodeSelector" in message


# ---- plan_pool: K and where it comes from ---------------------------------------------------


@pytest.mark.parametrize(
    ("speculative", "product", "k", "source", "mode"),
    [
        ({}, H100, 6, "profile", "auto"),
        ({}, H200, 6, "profile", "auto"),
        ({}, A100, 4, "profile", "auto"),
        ({}, L40S, 2, "profile", "auto"),
        ({}, "NVIDIA-RTX-PRO-6000", 3, "profile", "auto"),  # not in the table: the default
        ({}, MIG, 1, "profile", "auto"),  # a 1g slice: 1/7 of an A100's K 4, at least 1
        ({}, SHARED, 3, "profile", "auto"),  # time-shared: half of H200's K 6
        ({}, "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", 2, "profile", "auto"),  # 3/7 of 6
        ({}, "NVIDIA-H100-80GB-HBM3-MIG-7g.80gb", 6, "profile", "auto"),  # the whole card
        ({"numSpeculativeTokens": 3}, H100, 3, "override", "fixed"),
        ({"numSpeculativeTokens": 3}, L40S, 3, "override", "fixed"),
        ({"profiles": {"H100": 5}}, H100, 5, "override", "auto"),
        ({"profiles": {H100: 5, "H100": 1}}, H100, 5, "override", "auto"),  # exact name first
        ({"profiles": {"H100": 5}}, H200, 6, "profile", "auto"),
        ({"maxSpeculativeTokens": 4}, H100, 4, "cap", "auto"),
        ({"maxSpeculativeTokens": 4}, L40S, 2, "profile", "auto"),
        ({"profiles": {"H100": 5}, "maxSpeculativeTokens": 4}, H100, 4, "cap", "auto"),
        ({"mtpLayers": 4}, H100, 4, "cap", "auto"),  # 6 is no multiple of 4
        ({"mtpLayers": 2}, H100, 6, "profile", "auto"),  # 6 is
        ({"mtpLayers": 1}, H100, 6, "profile", "auto"),
        ({"numSpeculativeTokens": 0}, H100, 0, "off", "fixed"),
        ({"profiles": {"L40S": 0}}, L40S, 0, "off", "auto"),
        ({"maxSpeculativeTokens": 0}, H100, 0, "off", "auto"),
    ],
)
def test_plan_pool_sources(
    speculative: dict[str, Any], product: str, k: int, source: str, mode: str
) -> None:
    plan = plan_pool(_spec(speculative=speculative), product)
    assert (plan.gpu_product, plan.k, plan.source, plan.k_mode) == (product, k, source, mode)
    assert plan.serve.num_speculative_tokens == k
    assert plan.reason
    assert ("--speculative-config" in build_argv(plan.serve)) is (k > 0)


def test_cluster_profiles() -> None:
    spec = _spec()
    plan = plan_pool(spec, H100, {"H100": 5})
    assert (plan.k, plan.source) == (5, "profile")
    assert plan_pool(spec, H100, {H100: 4, "H100": 5}).k == 4
    assert plan_pool(spec, H200, {"H100": 5}).k == 6
    # the resource's own profiles win over the cluster's table
    own = _spec(speculative={"profiles": {"H100": 2}})
    assert (plan_pool(own, H100, {"H100": 5}).k, plan_pool(own, H100, {"H100": 5}).source) == (
        2,
        "override",
    )
    # and an explicit K over both
    fixed = _spec(speculative={"numSpeculativeTokens": 1})
    assert plan_pool(fixed, H100, {"H100": 5}).k == 1


def test_plan_carries_the_serve_settings() -> None:
    spec = _spec(
        tensorParallelSize=4,
        maxModelLen=32768,
        reasoningParser="qwen3",
        servedModelName="m",
        modelSource="modelscope",
        extraArgs=["--enforce-eager"],
        speculative={"method": "qwen3_next_mtp", "mtpLayers": 1},
    )
    serve = plan_pool(spec, H100).serve
    assert (serve.model, serve.tensor_parallel_size, serve.max_model_len) == (
        "org/model",
        4,
        "32768",
    )
    assert (serve.reasoning_parser, serve.served_model_name, serve.model_source) == (
        "qwen3",
        "m",
        "modelscope",
    )
    assert (serve.method, serve.mtp_layers, serve.extra_args) == (
        "qwen3_next_mtp",
        1,
        ("--enforce-eager",),
    )


# ---- rollback pins --------------------------------------------------------------------------


def test_rollback_lowers_k() -> None:
    plan = plan_pool(_spec(), H100, rollback_k=4)
    assert (plan.k, plan.source, plan.k_mode) == (4, "rollback", "fixed")
    assert "rolled back from K=6" in plan.reason
    off = plan_pool(_spec(), H100, rollback_k=0)
    assert (off.k, off.source) == (0, "rollback")
    assert "--speculative-config" not in build_argv(off.serve)


@pytest.mark.parametrize("pin", [6, 7, 12])
def test_rollback_never_raises_k_above_the_spec(pin: int) -> None:
    plan = plan_pool(_spec(), H100, rollback_k=pin)
    assert (plan.k, plan.source, plan.k_mode) == (6, "profile", "auto")
    # the spec was lowered below the pin since: the spec's K wins
    lowered = plan_pool(_spec(speculative={"numSpeculativeTokens": 2}), H100, rollback_k=pin)
    assert (lowered.k, lowered.source) == (2, "override")
    off = plan_pool(_spec(speculative={"numSpeculativeTokens": 0}), H100, rollback_k=pin)
    assert (off.k, off.source) == (0, "off")


def test_rollback_below_a_cap() -> None:
    spec = _spec(speculative={"maxSpeculativeTokens": 4})
    assert plan_pool(spec, H100, rollback_k=5).source == "cap"
    assert (plan_pool(spec, H100, rollback_k=3).k, plan_pool(spec, H100, rollback_k=3).source) == (
        3,
        "rollback",
    )


# ---- errors name the field ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("speculative", "extra", "product", "field", "text"),
    [
        ({"numSpeculativeTokens": 5, "maxSpeculativeTokens": 4}, {}, H100,
         "speculative.numSpeculativeTokens", "exceeds speculative.maxSpeculativeTokens=4"),
        ({"numSpeculativeTokens": 3, "mtpLayers": 2}, {}, H100,
         "speculative.numSpeculativeTokens", "mtpLayers=2"),
        ({"profiles": {"H100": 3}, "mtpLayers": 2}, {}, H100,
         "speculative.profiles[NVIDIA-H100-80GB-HBM3]", "multiple of it (2, 4, 6, ...)"),
        ({"method": "eagle"}, {}, H100, "speculative.method", "'eagle' is not an MTP method"),
        ({}, {"extraArgs": ["--port=9000"]}, H100, "extraArgs[0]", "--port"),
        ({}, {"extraArgs": ["-sc.method", "ngram"]}, H100, "extraArgs[0]", "-sc"),
    ],
)  # fmt: skip
def test_plan_error_names_the_field(
    speculative: dict[str, Any], extra: dict[str, Any], product: str, field: str, text: str
) -> None:
    with pytest.raises(PlanError) as err:
        plan_pool(_spec(speculative=speculative, **extra), product)
    assert any(f == field and text in m for f, m in err.value.problems), err.value.problems
    assert f"{field}: " in str(err.value)


def test_a_profile_entry_for_another_gpu_does_not_stop_this_pool() -> None:
    spec = _spec(speculative={"profiles": {"H100": 3}, "mtpLayers": 2})
    assert plan_pool(spec, H200).k == 6
    with pytest.raises(PlanError):
        plan_pool(spec, H100)


def test_method_is_only_checked_when_speculating() -> None:
    spec = _spec(speculative={"method": "eagle", "numSpeculativeTokens": 0})
    assert plan_pool(spec, H100).k == 0


# ---- validate_spec: without cluster state ---------------------------------------------------


def test_validate_spec_checks_every_profile_entry() -> None:
    """A bad entry is reported whether or not the cluster has that GPU now."""
    spec = _spec(
        speculative={"mtpLayers": 2, "profiles": {"H100": 3, A100: 4, "B200": 5, "T4": -1}}
    )
    found = validate_spec(spec)
    assert [f for f, _ in found] == [
        "speculative.profiles[B200]",
        "speculative.profiles[H100]",
        "speculative.profiles[T4]",
    ]
    assert "0 (off) or more" in found[2][1]
    assert validate_spec(_spec(speculative={"mtpLayers": 2, "profiles": {"H100": 4}})) == []
    # profiles don't apply to an explicit K
    fixed = _spec(speculative={"numSpeculativeTokens": 2, "mtpLayers": 2, "profiles": {"H100": 3}})
    assert validate_spec(fixed) == []


def test_validate_spec_reports_spec_wide_problems_once() -> None:
    spec = _spec(speculative={"method": "eagle", "profiles": {"H100": 3, "A100": 2}})
    assert validate_spec(spec) == [
        ("speculative.method", "'eagle' is not an MTP method vLLM 0.33.0 accepts")
    ]


# ---- pool_fates: pools survive maintenance ------------------------------------------------

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _fates(spec: MTPInferenceSpec, nodes: list[GPUNode], existing: list[str],
           gone: dict[str, datetime] | None = None, grace: float = 600):
    fit = fitting_products(spec, nodes)
    return {f.gpu_product: f for f in pool_fates(spec, nodes, existing, fit, gone or {}, NOW,
                                                 grace)}


@pytest.mark.parametrize(
    "node",
    [
        _node(H100, schedulable=False),  # cordoned / NotReady / drained
        GPUNode("n", H100, 0, {}, True, capacity_gpus=8),  # GPUs not allocatable right now
        GPUNode("n", H100, 2, {}, True, capacity_gpus=8),  # some GPUs taken
    ],
    ids=["unschedulable", "allocatable-0", "allocatable-below-tp"],
)
def test_a_pool_without_a_schedulable_node_is_retained(node: GPUNode) -> None:
    spec = _spec(tensorParallelSize=4)
    fates = _fates(spec, [node, _node(A100)], [H100, A100])
    assert set(fates) == {H100}  # A100 fits: planned as usual, no fate
    f = fates[H100]
    assert (f.action, f.reason, f.remove_at) == ("retain", "NoSchedulableNode", None)
    assert "pods keep running" in f.message


def test_a_product_no_node_carries_is_kept_for_the_grace_period_then_removed() -> None:
    spec = _spec()
    first = _fates(spec, [_node(A100)], [H100])[H100]
    assert (first.action, first.reason, first.gone_since) == ("retain", "ProductGone", NOW)
    assert first.remove_at == NOW + timedelta(seconds=600)
    later = _fates(spec, [_node(A100)], [H100], {H100: NOW - timedelta(seconds=599)})[H100]
    assert later.action == "retain" and later.gone_since == NOW - timedelta(seconds=599)
    due = _fates(spec, [_node(A100)], [H100], {H100: NOW - timedelta(seconds=600)})[H100]
    assert (due.action, due.reason) == ("remove", "ProductGone")
    assert _fates(spec, [], [H100], grace=0)[H100].action == "remove"


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"gpuProducts": [A100]}, "gpuProducts"),
        ({"nodeSelector": {"zone": "z9"}}, "nodeSelector"),
        ({"tensorParallelSize": 16}, "tensorParallelSize"),
    ],
    ids=["gpuProducts", "nodeSelector", "tensorParallelSize"],
)
def test_a_pool_the_spec_excludes_is_removed_at_once(fields: dict, why: str) -> None:
    spec = _spec(**fields)
    f = _fates(spec, [_node(H100, zone="z1"), _node(A100, gpus=16, zone="z9")], [H100])[H100]
    assert (f.action, f.reason) == ("remove", "ExcludedBySpec") and why in f.message


def test_fitting_pools_have_no_fate() -> None:
    assert _fates(_spec(), [_node(H100)], [H100]) == {}
