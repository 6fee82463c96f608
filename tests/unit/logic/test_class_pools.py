"""Traffic classes (issue 39): a pool per (GPU product, class) with the class's K, labelled with
its class (and prompt-length range); per class pool status, rollback pin, tuning and fate;
the routing objects (InferencePool, endpoint picker config, a Service per class). Without
classes nothing changes: the other unit tests run unchanged."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import product as cartesian

import pytest
import yaml

from mtp_operator import routing
from mtp_operator.api.classes import MAX_PROMPT_TOKENS
from mtp_operator.api.v1alpha1 import MTPInferenceSpec, MTPInferenceStatus, PoolStatus
from mtp_operator.builders import desired_objects
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.naming import (
    LABEL_CONTEXT_LENGTH_RANGE,
    LABEL_TRAFFIC_CLASS,
    class_service_name,
    pool_deployment_name,
    split_pool_key,
)
from mtp_operator.planning import GPUNode
from mtp_operator.reconcile_plan import plan_pass, product_of
from mtp_operator.settings import OperatorSettings
from mtp_runtime.gpu_profiles import DEFAULT_PROFILES
from support.fake_cluster import FakeKube, FakeView, mtpinference, node

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
# the field report's thresholds as an example (<128 tokens K=4, 128-512 K=3, >512 K=2) and a
# header class whose K comes from the profile table
CLASSES = [
    {"name": "short", "promptTokens": {"max": 127}, "numSpeculativeTokens": 4},
    {"name": "mid", "promptTokens": {"min": 128, "max": 512}, "numSpeculativeTokens": 3},
    {"name": "long", "promptTokens": {"min": 513}, "numSpeculativeTokens": 2},
    {"name": "code", "header": {"name": "X-MTP-Class", "value": "code"}},
]
NODES = [GPUNode("h1", H100, 8, {}, True, 8), GPUNode("l1", L40S, 8, {}, True, 8)]


def _spec(classes=CLASSES, **extra) -> MTPInferenceSpec:
    return MTPInferenceSpec.model_validate(
        {"model": "org/m", **extra, "speculative": {"classes": classes}}
    )


def _plan(spec, previous=None, existing=(), nodes=NODES, now=T0):
    return plan_pass(spec, [], nodes, previous or MTPInferenceStatus(), {"generation": 1}, {},
                     now, existing)


def _profile_k(family: str) -> int:
    return next(p.k for p in DEFAULT_PROFILES if p.family == family)


def test_one_pool_per_product_and_class_with_the_class_k():
    plan = _plan(_spec())
    assert plan.problems == []
    got = {p.key: p.k for p in plan.pools}
    want = {}
    for product, family in ((H100, "H100"), (L40S, "L40S")):
        want |= {f"{product}/short": 4, f"{product}/mid": 3, f"{product}/long": 2,
                 f"{product}/code": _profile_k(family)}  # `auto`: the product's profile
    assert got == want
    assert [p.key for p in plan.pools] == sorted(want)
    for p in plan.pools:
        assert (p.gpu_product, p.traffic_class) == split_pool_key(p.key)
        assert p.serve.num_speculative_tokens == p.k


def test_class_pools_are_labelled_and_named_injectively():
    spec = _spec()
    plan = _plan(spec)
    objs = desired_objects("qwen", "ns", "uid", spec, plan.pools, "img")
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    assert len(deployments) == len(plan.pools) == 8
    ranges = {"short": "0-127", "mid": "128-512", "long": f"513-{MAX_PROMPT_TOKENS}"}
    for dep, plan_ in zip(deployments, plan.pools, strict=True):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert labels[LABEL_TRAFFIC_CLASS] == plan_.traffic_class
        assert labels.get(LABEL_CONTEXT_LENGTH_RANGE) == ranges.get(plan_.traffic_class)
        assert dep["spec"]["selector"]["matchLabels"][LABEL_TRAFFIC_CLASS] == plan_.traffic_class
        assert product_of(dep) == plan_.key
    assert len({d["metadata"]["name"] for d in deployments}) == len(deployments)


@pytest.mark.parametrize("cls", ["long", "a", "x1"])
def test_a_class_pool_name_is_no_unclassed_pool_name(cls):
    # a product whose slug ends like a class: NVIDIA-H100-LONG unclassed vs NVIDIA-H100 `long`
    products = ["NVIDIA-H100", f"NVIDIA-H100-{cls.upper()}", "H100", f"nvidia-h100-{cls}"]
    names = {}
    for p, c in cartesian(products, [None, cls]):
        name = pool_deployment_name("res", p, c)
        assert name not in names, (p, c, names.get(name))
        names[name] = (p, c)


def test_status_summary_names_class_pools_and_pins_one_class_pool():
    spec = _spec()
    first = _plan(spec)
    key = f"{H100}/long"
    previous = MTPInferenceStatus(pools=[
        PoolStatus(gpu_product=H100, traffic_class="long", num_speculative_tokens=2,
                   source="override", deployment="x", rollback_k=1, rollback_generation=1),
    ])
    plan = _plan(spec, previous)
    ks = {p.key: p.k for p in plan.pools}
    assert ks[key] == 1 and ks[f"{L40S}/long"] == 2 and ks[f"{H100}/short"] == 4
    assert {p.key: p.k for p in first.pools if p.key != key} == {
        k: v for k, v in ks.items() if k != key}
    from mtp_operator.reconcile_plan import Applied, pass_status
    status = pass_status("qwen", 1, plan, previous, {}, Applied(), T0)
    assert "H100/long:1" in status.pools_summary.split()
    assert "L40S/code:2" in status.pools_summary.split()
    entry = next(p for p in status.pools if p.key == key)
    assert entry.traffic_class == "long" and entry.gpu_product == H100
    assert entry.deployment == pool_deployment_name("qwen", H100, "long")


def test_fates_follow_the_class_list():
    spec = _spec()
    existing = [H100, f"{H100}/long", f"{H100}/gone", f"{L40S}/short"]
    fates = {f.key: f for f in _plan(spec, existing=existing).fates}
    # an unclassed pool once classes are set, and a class the spec no longer has: removed
    assert fates[H100].action == "remove" and fates[H100].reason == "ExcludedBySpec"
    assert fates[f"{H100}/gone"].action == "remove"
    assert f"{H100}/long" not in fates and f"{L40S}/short" not in fates  # planned
    # the L40S node leaves: its class pools are retained together, for the grace period
    plan = _plan(spec, existing=existing, nodes=NODES[:1])
    retained = {f.key for f in plan.fates if f.action == "retain"}
    assert retained == {f"{L40S}/short"}
    # classes removed: every class pool goes
    plain = MTPInferenceSpec.model_validate({"model": "org/m"})
    fates = {f.key: f.action for f in _plan(plain, existing=existing).fates}
    assert fates == {f"{H100}/long": "remove", f"{H100}/gone": "remove",
                     f"{L40S}/short": "remove"}


def test_routing_objects_select_every_pool_and_route_each_class():
    spec = _spec()
    plan = _plan(spec)
    objs = desired_objects("qwen", "ns", "uid", spec, plan.pools, "img")
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    (pool,) = by_kind["InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    selector = pool["spec"]["selector"]["matchLabels"]
    for dep in by_kind["Deployment"]:  # every pool pod, every class and product
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector.items())
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
    for c in CLASSES:
        svc = services[class_service_name("qwen", c["name"])]
        assert svc["spec"]["selector"][LABEL_TRAFFIC_CLASS] == c["name"]
        chosen = [d for d in by_kind["Deployment"] if all(
            d["spec"]["template"]["metadata"]["labels"].get(k) == v
            for k, v in svc["spec"]["selector"].items())]
        assert len(chosen) == 2  # one per product
    (cm,) = by_kind["ConfigMap"]
    config = yaml.safe_load(cm["data"][routing.PICKER_CONFIG_KEY])
    assert config["kind"] == "EndpointPickerConfig"
    names = {p["name"] for p in config["plugins"]}
    refs = [r["pluginRef"] for prof in config["schedulingProfiles"] for r in prof["plugins"]]
    assert set(refs) <= names and refs[0] == routing.CLASS_FILTER_NAME
    params = config["plugins"][0]["parameters"]
    assert params["classLabel"] == LABEL_TRAFFIC_CLASS
    assert params["classes"][0] == {"name": "code",
                                    "header": {"name": "x-mtp-class", "value": "code"}}
    ranges = {c["name"]: (c["promptTokens"]["min"], c["promptTokens"]["max"])
              for c in params["classes"] if "promptTokens" in c}
    assert ranges == {"short": (0, 127), "mid": (128, 512), "long": (513, MAX_PROMPT_TOKENS)}
    # each prompt length falls in exactly one range
    for n in (0, 127, 128, 512, 513, 10**6):
        assert sum(lo <= n <= hi for lo, hi in ranges.values()) == 1


def test_without_classes_no_routing_objects_and_plain_pools():
    spec = MTPInferenceSpec.model_validate({"model": "org/m"})
    plan = _plan(spec)
    objs = desired_objects("qwen", "ns", "uid", spec, plan.pools, "img")
    assert [o["kind"] for o in objs] == ["Service", "Deployment", "Deployment"]
    for dep in objs[1:]:
        assert LABEL_TRAFFIC_CLASS not in dep["metadata"]["labels"]
        assert dep["metadata"]["name"] == pool_deployment_name("qwen", product_of(dep))


async def test_the_reconciler_runs_class_pools_and_applies_the_routing_objects():
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100), node("l1", L40S)])
    view.add(mtpinference("res", {"model": "org/m", "speculative": {"classes": CLASSES}}))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    await rec.reconcile(("ml", "res"))
    view.deliver(kube, ready=True)
    await rec.reconcile(("ml", "res"))
    deps = kube.deployments()
    assert set(deps) == {f"{p}/{c['name']}" for p in (H100, L40S) for c in CLASSES}
    kinds = sorted(k for (k, _, _) in kube.objects)
    assert kinds.count("InferencePool") == 1 and kinds.count("ConfigMap") == 1
    assert kinds.count("Service") == 1 + len(CLASSES)
    status = kube.statuses[("ml", "res")]
    assert status["phase"] == "Ready", status
    assert "H100/short:4" in status["poolsSummary"].split()
    # a second pass with nothing changed writes nothing
    writes = len(kube.calls)
    view.deliver(kube, ready=True)
    await rec.reconcile(("ml", "res"))
    assert len(kube.calls) == writes, kube.calls[writes:]
    # an edit that drops a class removes exactly its pools
    view.add(mtpinference("res", {"model": "org/m", "speculative": {"classes": [
        *CLASSES[:3], {"name": "code", "header": {"name": "x-other", "value": "1"}}]}},
        generation=2))
    await rec.reconcile(("ml", "res"))
    assert set(kube.deployments()) == set(deps)
    view.add(mtpinference("res", {"model": "org/m", "speculative": {"classes": [
        {"name": "all", "numSpeculativeTokens": 1}]}}, generation=3))
    view.deliver(kube, ready=True)
    await rec.reconcile(("ml", "res"))
    assert set(kube.deployments()) == {f"{H100}/all", f"{L40S}/all"}


def test_render_plans_class_pools_as_the_operator_does():
    from pathlib import Path

    from mtp_operator.render import render_documents

    text = (Path(__file__).resolve().parents[3] / "examples" / "traffic-classes.yaml").read_text()
    docs = list(yaml.safe_load_all(render_documents(text)))
    kinds = [d["kind"] for d in docs]
    classes = yaml.safe_load(text)["spec"]["speculative"]["classes"]
    products = {d["metadata"]["annotations"]["mtp-operator.io/gpu-product"]
                for d in docs if d["kind"] == "Deployment"}
    assert kinds.count("Deployment") == len(products) * len(classes)
    assert kinds.count("InferencePool") == 1 and kinds.count("ConfigMap") == 1
    assert kinds.count("Service") == 1 + len(classes)


def _routing(kube: FakeKube) -> set[tuple[str, str]]:
    return {(kind, name) for (kind, _, name) in kube.objects
            if kind in ("InferencePool", "ConfigMap") or (kind == "Service" and "-class" in name)}


async def test_routing_objects_of_classes_taken_out_are_deleted_owned_ones_only():
    from mtp_operator.control.reconciler import TransientReconcileError
    from mtp_operator.naming import inference_pool_name, picker_config_name
    from support.fake_cluster import api_error

    key = ("ml", "res")
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100)])
    view.add(mtpinference("res", {"model": "org/m", "speculative": {"classes": CLASSES}}))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    await rec.reconcile(key)
    view.deliver(kube, ready=True)
    ip = ("InferencePool", inference_pool_name("res"))
    cm = ("ConfigMap", picker_config_name("res"))
    services = {c["name"]: ("Service", class_service_name("res", c["name"])) for c in CLASSES}
    assert _routing(kube) == {ip, cm, *services.values()}

    # one class out: its Service goes (read, then deleted), the others and the pool stay; the
    # picker's config is written again without it
    view.add(mtpinference("res", {"model": "org/m", "speculative": {"classes": CLASSES[:3]}},
                          generation=2))
    kube.calls.clear()
    await rec.reconcile(key)
    assert _routing(kube) == {ip, cm, services["short"], services["mid"], services["long"]}
    assert ("delete", services["code"][1]) in kube.calls
    assert ("apply", cm[1]) in kube.calls and ("apply", ip[1]) not in kube.calls
    # once the watch shows it, a pass with nothing to do makes no request at all
    view.deliver(kube, ready=True)
    await rec.reconcile(key)
    kube.calls.clear()
    await rec.reconcile(key)
    assert kube.calls == []

    # the picker's ConfigMap is someone else's now (another controller): it is left alone
    kube.objects[("ConfigMap", "ml", cm[1])]["metadata"]["ownerReferences"] = [
        {"kind": "ConfigMap", "name": "x", "uid": "other", "controller": True}]
    # no classes left, after a restart (the new process applied nothing: what the watch
    # shows is all it knows) and a first delete that fails: the next pass finishes the job
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    view.add(mtpinference("res", {"model": "org/m"}, generation=3))
    kube.fail["delete_owned"] = api_error(500)
    with pytest.raises(TransientReconcileError):
        await rec.reconcile(key)
    assert _routing(kube) == {ip, cm, services["short"], services["mid"], services["long"]}
    await rec.reconcile(key)
    assert _routing(kube) == {cm}  # only the ConfigMap this resource does not control
    assert set(kube.deployments()) == {H100}
    view.deliver(kube, ready=True)
    await rec.reconcile(key)
    kube.calls.clear()
    await rec.reconcile(key)
    assert kube.calls == []
