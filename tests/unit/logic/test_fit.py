"""spec.fit: the GPU memory arithmetic per product (issue 38). Expected figures are worked
out here from the labels' MiB, never copied from the code's output."""

from __future__ import annotations

import math

import pytest

from mtp_operator.api.v1alpha1 import FitSpec, MTPInferenceSpec
from mtp_operator.fit import ProductShape, decide, gpu_memory_mib, shape_of, summary
from mtp_operator.planning import GPUNode, fitting_products, pool_fates, product_fits
from mtp_operator.validation import spec_problems

H200, H100 = "NVIDIA-H200", "NVIDIA-H100-80GB-HBM3"
A100, L40S = "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"
MIB = {H200: 143771, H100: 81559, A100: 81920, L40S: 46068}  # nvidia-smi memory.total
DEEPSEEK = "deepseek-ai/DeepSeek-V3"


def _fit(weights: float, headroom: float = 0.2, most: int = 4) -> FitSpec:
    return FitSpec.model_validate(
        {"weightsGiB": weights, "headroom": headroom, "maxNodesPerReplica": most}
    )


def _shape(product: str, nodes: int = 2, gpus: int = 8) -> ProductShape:
    return ProductShape(product, (gpus,) * nodes, MIB[product])


def _usable_gib(product: str, headroom: float = 0.2) -> float:
    return MIB[product] / 1024 * (1 - headroom)


def test_a_replica_that_holds_the_weights_is_one_node() -> None:
    # 27B in BF16 = 54e9 bytes = 50.3 GiB; 1 x H100 holds 79.6 x 0.8 = 63.7 GiB
    weights = 27e9 * 2 / 2**30
    f = decide(_fit(weights), "m", 1, _shape(H100))
    assert (f.verdict, f.nodes, f.gpus_per_pod, f.pipeline_parallel_size) == ("OneNode", 1, 1, 1)
    # 1 x L40S holds 45.0 x 0.8 = 36.0 GiB: not 50.3; a whole node would, the message says so
    f = decide(_fit(weights), "m", 1, _shape(L40S))
    assert f.verdict == "DoesNotFit" and f.permanent
    assert "raise tensorParallelSize" in f.message
    assert f"{math.floor(MIB[L40S] / 1024 + 0.5)} GiB does not hold it" in f.message


@pytest.mark.parametrize(
    ("product", "want_nodes"),
    [
        (H200, 1),  # 8 x 140.4 x 0.8 = 898.6 >= 652
        (H100, 2),  # 8 x 79.6 x 0.8 = 509.8 < 652 <= 1019.7
        (A100, 2),  # 8 x 80.0 x 0.8 = 512.0 < 652
        (L40S, 3),  # 8 x 45.0 x 0.8 = 287.9: 652 / 287.9 = 2.26 -> 3
    ],
)
def test_deepseek_v3_nodes_per_product(product: str, want_nodes: int) -> None:
    weights, tp = 652.0, 8
    stages = math.ceil(weights / (tp * _usable_gib(product)))
    assert stages == want_nodes  # the worked figures above hold for these labels
    f = decide(_fit(weights), DEEPSEEK, tp, _shape(product, nodes=3))
    assert f.nodes == want_nodes
    assert f.verdict == ("OneNode" if want_nodes == 1 else "MultiNode")
    assert f.pipeline_parallel_size == want_nodes
    assert f.gpus_per_pod == 8
    assert f.pipeline_parallel_size * f.tensor_parallel_size == f.nodes * f.gpus_per_pod


def test_more_nodes_than_allowed_is_refused_with_the_numbers() -> None:
    f = decide(_fit(652, most=2), DEEPSEEK, 8, _shape(L40S))
    node_gib = 8 * MIB[L40S] / 1024  # 359.9
    assert f.verdict == "DoesNotFit" and f.permanent
    assert "~652 GiB" in f.message
    assert f"(+20% headroom: {652 / 0.8:.0f} GiB)" in f.message  # 815
    assert f"8 x {L40S} = {node_gib:.0f} GiB a node" in f.message  # 360
    assert "3 nodes needed, fit.maxNodesPerReplica 2" in f.message
    assert f"({2 * node_gib:,.0f} GiB)" in f.message  # 720


def test_too_few_nodes_now_is_not_permanent() -> None:
    f = decide(_fit(652), DEEPSEEK, 8, _shape(L40S, nodes=2))  # needs 3 of 8 GPUs
    assert f.verdict == "DoesNotFit" and not f.permanent
    assert "spans 3 nodes" in f.message and "2 schedulable" in f.message
    # a node with fewer allocatable GPUs does not count
    f = decide(_fit(652), DEEPSEEK, 8, ProductShape(H100, (8, 6), MIB[H100]))
    assert f.verdict == "DoesNotFit" and not f.permanent


def test_headroom_moves_the_line() -> None:
    # 8 x H200 = 1123.2 GiB: 652 fits with headroom 0.4 (673.9) but not 0.45 (617.8)
    gib = 8 * MIB[H200] / 1024
    assert 652 <= gib * 0.6 and 652 > gib * 0.55
    assert decide(_fit(652, headroom=0.4), DEEPSEEK, 8, _shape(H200)).nodes == 1
    f = decide(_fit(652, headroom=0.45), DEEPSEEK, 8, _shape(H200, nodes=1))
    assert f.verdict == "DoesNotFit" and not f.permanent  # 2 nodes needed, 1 there
    assert decide(_fit(652, headroom=0.45), DEEPSEEK, 8, _shape(H200)).nodes == 2
    # headroom 0: weights may fill the GPU exactly
    assert decide(_fit(gib), DEEPSEEK, 8, _shape(H200)).nodes == 2  # 1 / 0.8 -> 2 stages
    assert decide(_fit(gib, headroom=0), DEEPSEEK, 8, _shape(H200)).verdict == "OneNode"


def test_tensor_parallel_across_nodes() -> None:
    # tensorParallelSize 16 on nodes of 8: at least 2 nodes, more stages in pairs of nodes
    f = decide(_fit(100), DEEPSEEK, 16, _shape(H100, nodes=4))
    assert (f.verdict, f.nodes, f.pipeline_parallel_size, f.gpus_per_pod) == ("MultiNode", 2, 1, 8)
    # 16 x 79.6 x 0.8 = 1019.7 GiB per stage: 1200 GiB needs 2 stages = 4 nodes
    f = decide(_fit(1200), DEEPSEEK, 16, _shape(H100, nodes=4))
    assert (f.nodes, f.pipeline_parallel_size) == (4, 2)
    f = decide(_fit(100), DEEPSEEK, 12, _shape(H100, nodes=4))
    assert f.verdict == "DoesNotFit" and "does not split over nodes of 8" in f.message


def test_gpu_memory_from_labels_mig_and_sharing() -> None:
    assert gpu_memory_mib({"nvidia.com/gpu.memory": "81559"}, H100) == 81559
    assert gpu_memory_mib({}, H100) is None
    assert gpu_memory_mib({"nvidia.com/gpu.memory": "x"}, H100) is None
    # MIG strategy single: GFD labels the slice; the profile caps a whole-card label
    mig = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert gpu_memory_mib({"nvidia.com/gpu.memory": "4864"}, mig) == 4864
    assert gpu_memory_mib({"nvidia.com/gpu.memory": "40960"}, mig) == 5 * 1024
    assert gpu_memory_mib({}, "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb") == 40 * 1024
    # time-slicing: 4 pods share one 80 GiB GPU, each gets 20 GiB of it
    shared = {"nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.replicas": "4"}
    assert gpu_memory_mib(shared, "NVIDIA-A100-SXM4-80GB-SHARED") == 20480


def test_a_mig_slice_refuses_a_model_the_whole_card_would_take() -> None:
    mig = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    nodes = [(7, {"nvidia.com/gpu.memory": "4864"})]
    shape = shape_of(mig, nodes)
    assert shape.gpu_memory_mib == 4864 and shape.gpus_per_node == 7
    # a 1.5B model in BF16 (2.8 GiB) fits one slice: 4.75 x 0.8 = 3.8 GiB
    assert decide(_fit(2.8), "m", 1, shape).verdict == "OneNode"
    # 8 GiB does not fit one slice, would fit 7 x 3.8 = 26.6: the message says raise TP
    f = decide(_fit(8), "m", 1, shape)
    assert f.verdict == "DoesNotFit" and "raise tensorParallelSize" in f.message


def test_nodes_without_the_memory_label_are_not_checked() -> None:
    shape = shape_of(H100, [(8, {})])
    f = decide(_fit(652), DEEPSEEK, 8, shape)
    assert f.verdict == "NotChecked" and "nvidia.com/gpu.memory" in f.message
    # one node without the label makes the product unchecked: its memory is unknown
    assert shape_of(H100, [(8, {"nvidia.com/gpu.memory": "81559"}), (8, {})]).gpu_memory_mib is None
    # the smallest memory of the product's nodes counts
    mixed = [(8, {"nvidia.com/gpu.memory": "81559"}), (8, {"nvidia.com/gpu.memory": "40960"})]
    assert shape_of(H100, mixed).gpu_memory_mib == 40960


def _nodes() -> list[GPUNode]:
    out = []
    for product, count in ((A100, 2), (H100, 2), (L40S, 2), (H200, 1)):
        for i in range(count):
            labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": str(MIB[product])}
            out.append(GPUNode(f"{product}-{i}", product, 8, labels, True, 8))
    return out


def _spec(**fields: object) -> MTPInferenceSpec:
    return MTPInferenceSpec.model_validate(
        {"model": DEEPSEEK, "tensorParallelSize": 8, **fields}
    )


def test_products_that_do_not_fit_get_no_pool() -> None:
    spec = _spec(fit={"weightsGiB": 652, "maxNodesPerReplica": 2})
    fits = product_fits(spec, _nodes())
    assert {p: (f.verdict, f.nodes) for p, f in fits.items() if f.placeable} == {
        A100: ("MultiNode", 2), H100: ("MultiNode", 2), H200: ("OneNode", 1)
    }
    assert fitting_products(spec, _nodes()) == [A100, H100, H200]
    assert summary(fits.values(), {A100: "A100", H100: "H100", H200: "H200", L40S: "L40S"}) == (
        "A100:2 H100:2 H200:1 L40S:no"
    )
    # without spec.fit: today's rule, every product with a node of 8 GPUs
    assert fitting_products(_spec(), _nodes()) == [A100, H100, H200, L40S]


def test_an_existing_pool_of_a_product_that_does_not_fit_is_removed() -> None:
    from datetime import UTC, datetime

    spec = _spec(fit={"weightsGiB": 652, "maxNodesPerReplica": 2})
    now = datetime(2026, 1, 1, tzinfo=UTC)
    fates = pool_fates(spec, _nodes(), [L40S, H200], fitting_products(spec, _nodes()), {}, now, 60)
    assert [(f.gpu_product, f.action) for f in fates] == [(L40S, "remove")]
    assert "3 nodes needed" in fates[0].message
    # too few nodes now (maxNodesPerReplica 4, 2 L40S nodes): retained as it runs
    spec = _spec(fit={"weightsGiB": 652})
    fates = pool_fates(spec, _nodes(), [L40S], fitting_products(spec, _nodes()), {}, now, 60)
    assert [(f.gpu_product, f.action) for f in fates] == [(L40S, "retain")]


@pytest.mark.parametrize(
    ("fit", "field"),
    [
        ({"weightsGiB": 0}, "fit.weightsGiB"),
        ({"weightsGiB": -1}, "fit.weightsGiB"),
        ({"weightsGiB": 10, "headroom": 0.95}, "fit.headroom"),
        ({"weightsGiB": 10, "maxNodesPerReplica": 0}, "fit.maxNodesPerReplica"),
        ({"headroom": 0.1}, "fit.weightsGiB"),
        ({"weightsGiB": 10, "weightsGib": 3}, "fit.weightsGib"),
    ],
)
def test_bad_fit_fields_are_named(fit: dict[str, object], field: str) -> None:
    _spec_obj, problems = spec_problems({"model": DEEPSEEK, "fit": fit})
    assert field in [p.field for p in problems], problems


# ---- a pass over an in-memory cluster ------------------------------------------------------


def _labelled(name: str, product: str) -> GPUNode:
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": str(MIB[product])}
    return GPUNode(name, product, 8, labels, True, 8)


async def test_a_pass_refuses_a_product_with_status_condition_and_one_event() -> None:
    from datetime import UTC, datetime

    from mtp_operator.control.reconciler import Reconciler
    from mtp_operator.settings import OperatorSettings
    from support.fake_cluster import FakeKube, FakeView, mtpinference

    # 400 GiB: 8 x H100 hold 8 x 79.6 x 0.8 = 509.8; 8 x L40S 287.9, and one node at most
    spec = {"model": "org/big", "tensorParallelSize": 8,
            "fit": {"weightsGiB": 400, "maxNodesPerReplica": 1}}
    kube, view = FakeKube(), FakeView(nodes=[_labelled("h", H100), _labelled("l", L40S)])
    key = view.add(mtpinference("big", spec))
    rec = Reconciler(kube, view, OperatorSettings(),
                     clock=lambda: datetime(2026, 12, 6, tzinfo=UTC))
    await rec.reconcile(key)
    assert [d["metadata"]["annotations"]["mtp-operator.io/gpu-product"]
            for d in kube.deployments().values()] == [H100]
    refusals = [(r, m) for _, r, m, t in kube.events if t == "Warning"]
    assert refusals == [("ProductDoesNotFit", refusals[0][1])]
    node_gib = 8 * MIB[L40S] / 1024
    assert refusals[0][1].startswith(f"{L40S} gets no pool: org/big needs ~400 GiB")
    assert f"8 x {L40S} = {node_gib:.0f} GiB a node, 2 nodes needed" in refusals[0][1]
    status = kube.statuses[key]
    assert status["fitSummary"] == "H100:1 L40S:no"
    assert [(f["gpuProduct"], f["verdict"]) for f in status["fit"]] == [
        (H100, "OneNode"), (L40S, "DoesNotFit")
    ]
    fits = next(c for c in status["conditions"] if c["type"] == "ModelFits")
    assert (fits["status"], fits["reason"]) == ("False", "ProductsDoNotFit")
    assert L40S in fits["message"] and H100 not in fits["message"]

    view.deliver(kube, ready=True)
    await rec.reconcile(key)
    assert len([e for e in kube.events if e[1] == "ProductDoesNotFit"]) == 1, "said once"

    # no product fits: Degraded, NoFittingNodes naming fit.weightsGiB, pools kept as they run
    body = mtpinference("big", {**spec, "fit": {"weightsGiB": 600, "maxNodesPerReplica": 1}},
                        generation=2)
    view.resources[key] = body
    await rec.reconcile(key)
    status = kube.statuses[key]
    assert status["phase"] == "Degraded"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "NoFittingNodes" and "fit.weightsGiB" in degraded["message"]
    assert status["fitSummary"] == "H100:no L40S:no"


async def test_without_spec_fit_status_says_not_checked() -> None:
    from datetime import UTC, datetime

    from mtp_operator.control.reconciler import Reconciler
    from mtp_operator.settings import OperatorSettings
    from support.fake_cluster import FakeKube, FakeView, mtpinference

    kube, view = FakeKube(), FakeView(nodes=[_labelled("h", H100), _labelled("l", L40S)])
    key = view.add(mtpinference("plain", {"model": "org/big", "tensorParallelSize": 8}))
    rec = Reconciler(kube, view, OperatorSettings(),
                     clock=lambda: datetime(2026, 12, 6, tzinfo=UTC))
    await rec.reconcile(key)
    assert len(kube.deployments()) == 2
    status = kube.statuses[key]
    assert status["fitSummary"] == "not checked" and status.get("fit", []) == []
    assert not any(c["type"] == "ModelFits" for c in status["conditions"])


def test_a_multi_node_product_gets_a_pool_of_node_groups() -> None:
    from datetime import UTC, datetime

    from mtp_operator.api.v1alpha1 import MTPInferenceStatus
    from mtp_operator.reconcile_plan import Applied, pass_status, plan_pass

    spec = _spec(fit={"weightsGiB": 652, "maxNodesPerReplica": 2})
    now = datetime(2026, 12, 6, tzinfo=UTC)
    plan = plan_pass(spec, [], _nodes(), MTPInferenceStatus(), {"generation": 1}, {}, now)
    # A100, H100: 2 nodes each (LeaderWorkerSet pools, tests/unit/logic/test_lws_pools.py)
    assert {p.gpu_product: p.nodes for p in plan.pools} == {A100: 2, H100: 2, H200: 1}
    status = pass_status("ds", 1, plan, MTPInferenceStatus(), {}, Applied(), now)
    by = {f.gpu_product: f for f in status.fit}
    assert by[H100].verdict == "MultiNode" and by[H100].nodes_per_replica == 2
    assert status.fit_summary == "A100:2 H100:2 H200:1 L40S:no"
