"""The operator against the real sandbox: pools per GPU product, status, bad input, GC."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from pathlib import Path

import pytest
import yaml

import support.mtpi as mtpi_helpers
from support.cluster_fixtures import get_json, wait_for

REPO = Path(__file__).resolve().parents[2]
SANDBOX_PRODUCTS = {
    "NVIDIA-A100-SXM4-80GB": "gpu-a100",
    "NVIDIA-H100-80GB-HBM3": "gpu-h100",
    "NVIDIA-H200": "gpu-h200",
    "NVIDIA-L40S": "gpu-l40s",
}
SEED_COMMAND = [
    "vllm", "serve", "Qwen/Qwen3.6-27B", "--port", "8000", "--tensor-parallel-size", "8",
    "--max-model-len", "262144", "--reasoning-parser", "qwen3", "--speculative-config",
    '{"method":"qwen3_next_mtp","num_speculative_tokens":2}',
]


mtpi = mtpi_helpers.manifest
resource = mtpi_helpers.resource
condition = mtpi_helpers.condition
wait_ready = mtpi_helpers.wait_ready


def apply(kubectl, namespace: str, manifest: str, check: bool = True):
    return kubectl("apply", "-n", namespace, "-f", "-", input=manifest, check=check)


def pools(kubectl, namespace: str) -> dict[str, dict]:
    return mtpi_helpers.deployments(kubectl, namespace)


def test_seed_example_one_pool_per_product(kubectl, namespace, operator):
    apply(kubectl, namespace, (REPO / "examples" / "qwen3.6-27b.yaml").read_text())
    name = yaml.safe_load((REPO / "examples" / "qwen3.6-27b.yaml").read_text())["metadata"]["name"]
    obj = wait_ready(kubectl, namespace, name)

    deployed = pools(kubectl, namespace)
    assert set(deployed) == set(SANDBOX_PRODUCTS)
    for dep in deployed.values():
        command = json.loads(dep["metadata"]["annotations"]["mtp-operator.io/vllm-command"])
        assert command == SEED_COMMAND
        container = dep["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["VLLM_USE_MODELSCOPE"] == "true"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert dep["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
        assert dep["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]

    pods = get_json(kubectl, "pods", "-n", namespace)["items"]
    assert len(pods) == 4
    for pod in pods:
        product = pod["metadata"]["labels"]["mtp-operator.io/gpu-product"]
        assert pod["spec"]["nodeName"].startswith(SANDBOX_PRODUCTS[product])
        assert condition(pod, "Ready").get("status") == "True"

    st = obj["status"]
    assert st["poolsSummary"] == "A100:2 H100:2 H200:2 L40S:2"
    assert st["ready"] == "4/4"
    assert {p["source"] for p in st["pools"]} == {"override"}
    assert condition(obj, "Ready")["status"] == "True"
    assert condition(obj, "Degraded")["status"] == "False"
    assert condition(obj, "SpeculationRolledBack")["status"] == "False"

    table = kubectl("get", "mtpi", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "MODEL", "POOLS", "RECOMMENDED", "READY", "PHASE",
                                   "AGE"]
    assert "A100:2 H100:2 H200:2 L40S:2" in table[1] and "4/4" in table[1]
    assert "Ready" in table[1]

    services = get_json(kubectl, "services", "-n", namespace)["items"]
    assert [s["metadata"]["name"] for s in services] == [f"{name}-openai"]


def test_auto_k_per_gpu_and_steady_state_makes_no_writes(kubectl, namespace, operator):
    apply(kubectl, namespace, mtpi("auto", speculative={"mtpLayers": 1}))
    obj = wait_ready(kubectl, namespace, "auto")
    ks = {p["gpuProduct"]: (p["numSpeculativeTokens"], p["source"]) for p in obj["status"]["pools"]}
    assert ks == {
        "NVIDIA-A100-SXM4-80GB": (4, "profile"),
        "NVIDIA-H100-80GB-HBM3": (6, "profile"),
        "NVIDIA-H200": (6, "profile"),
        "NVIDIA-L40S": (2, "profile"),
    }
    for product, dep in pools(kubectl, namespace).items():
        command = json.loads(dep["metadata"]["annotations"]["mtp-operator.io/vllm-command"])
        k = ks[product][0]
        assert command[-1] == json.dumps({"method": "mtp", "num_speculative_tokens": k},
                                         separators=(",", ":"))

    def counters() -> tuple[float, ...]:
        return tuple(operator.metric(f"mtp_operator_{n}_total")
                     for n in ("deployment_writes", "status_writes", "reconciles"))

    # the last pool status events handled: no pass for 2 s (passes are counted when done)
    seen: list[tuple[float, tuple[float, ...]]] = []

    def quiet() -> bool:
        seen.append((time.monotonic(), counters()))
        changed = [u for (_, c), (u, d) in itertools.pairwise(seen) if c != d]
        return seen[-1][0] - max(changed, default=seen[0][0]) >= 2

    wait_for(quiet, 30, interval=0.5, message="no reconcile for 2 s")
    writes, status_writes, passes = counters()
    time.sleep(10)  # the measurement: 10 s of nothing changing
    assert operator.metric("mtp_operator_deployment_writes_total") == writes
    assert operator.metric("mtp_operator_status_writes_total") == status_writes
    # reconciling again on an unchanged object changes nothing
    kubectl("annotate", "mtpi", "auto", "-n", namespace, "example.com/touch=1")
    wait_for(lambda: operator.metric("mtp_operator_reconciles_total") > passes, 20,
             message="a reconcile after the annotation (counted when done)")
    assert operator.metric("mtp_operator_deployment_writes_total") == writes
    assert operator.metric("mtp_operator_status_writes_total") == status_writes


def test_change_k_rolls_only_affected_pools(kubectl, namespace, operator):
    apply(kubectl, namespace, mtpi("roll", speculative={"profiles": {"H100": 5}}))
    wait_ready(kubectl, namespace, "roll")
    before = {p: d["metadata"]["annotations"]["mtp-operator.io/settings-hash"]
              for p, d in pools(kubectl, namespace).items()}
    apply(kubectl, namespace, mtpi("roll", speculative={"profiles": {"H100": 4}}))
    obj = wait_ready(kubectl, namespace, "roll")
    after = {p: d["metadata"]["annotations"]["mtp-operator.io/settings-hash"]
             for p, d in pools(kubectl, namespace).items()}
    changed = {p for p in before if before[p] != after[p]}
    assert changed == {"NVIDIA-H100-80GB-HBM3"}
    h100 = next(p for p in obj["status"]["pools"] if p["gpuProduct"].startswith("NVIDIA-H100"))
    assert (h100["numSpeculativeTokens"], h100["source"]) == (4, "override")


def _node(name: str, product: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "type": "kwok", "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": "183359", "kubernetes.io/hostname": name},
            "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "status": {"capacity": {"cpu": "64", "memory": "1Ti", "pods": "110",
                                "nvidia.com/gpu": "8"},
                   "allocatable": {"cpu": "64", "memory": "1Ti", "pods": "110",
                                   "nvidia.com/gpu": "8"}},
    })


def test_new_gpu_product_adds_a_pool_and_its_removal_removes_it(kubectl, namespace,
                                                               start_operator, tmp_path):
    # a product gone from every node keeps its pool for the grace period (test_maintenance.py)
    settings = tmp_path / "settings.yaml"
    settings.write_text("poolRemovalGraceSeconds: 2\n")
    start_operator("--namespace", namespace, "--no-evaluator", "--settings", str(settings))
    product = f"NVIDIA-B200-T{uuid.uuid4().hex[:4].upper()}"
    apply(kubectl, namespace, mtpi("nodes"))
    wait_ready(kubectl, namespace, "nodes")
    names = [f"gpu-b200-{uuid.uuid4().hex[:5]}" for _ in range(2)]
    try:
        for n in names:
            kubectl("apply", "-f", "-", input=_node(n, product))
        wait_for(lambda: product in pools(kubectl, namespace), 60, message="B200 pool")
        obj = wait_ready(kubectl, namespace, "nodes")
        b200 = next(p for p in obj["status"]["pools"] if p["gpuProduct"] == product)
        assert b200["numSpeculativeTokens"] == 6  # B200 profile
        pod = wait_for(lambda: [p for p in get_json(kubectl, "pods", "-n", namespace)["items"]
                                if p["metadata"]["labels"]["mtp-operator.io/gpu-product"]
                                == product and p["spec"].get("nodeName")], 60,
                       message="B200 pod scheduled")[0]
        assert pod["spec"]["nodeName"] in names
    finally:
        kubectl("delete", "node", *names, "--ignore-not-found")
    wait_for(lambda: product not in pools(kubectl, namespace), 60, message="B200 pool removed")
    obj = wait_ready(kubectl, namespace, "nodes")
    assert product in obj["status"]["removedPools"]
    assert product not in {p["gpuProduct"] for p in obj["status"]["pools"]}
    events = get_json(kubectl, "events", "-n", namespace)["items"]
    assert any(e["reason"] == "PoolRemoved" and product in e["message"] for e in events)


# ---- bad input ----------------------------------------------------------------------------

# Refused by the API server (schema and CEL); each message must name the field.
REFUSED = [
    ({"model": None}, "spec.model"),
    ({"model": ""}, "spec.model"),
    ({"replicas": -1}, "spec.replicas"),
    ({"replicas": "two"}, "spec.replicas"),
    ({"tensorParallelSize": 0}, "spec.tensorParallelSize"),
    ({"modelSource": "s3"}, "spec.modelSource"),
    ({"speculative": {"numSpeculativeTokens": -1}}, "spec.speculative.numSpeculativeTokens"),
    ({"speculative": {"numSpeculativeTokens": "many"}}, "spec.speculative.numSpeculativeTokens"),
    ({"speculative": {"numSpeculativeTokens": 8, "maxSpeculativeTokens": 4}},
     "spec.speculative.numSpeculativeTokens"),
    ({"speculative": {"numSpeculativeTokens": 3, "mtpLayers": 2}},
     "spec.speculative.numSpeculativeTokens"),
    ({"speculative": {"mtpLayers": 0}}, "spec.speculative.mtpLayers"),
    ({"speculative": {"maxSpeculativeTokens": -1}}, "spec.speculative.maxSpeculativeTokens"),
    ({"speculative": {"profiles": {"H100": -2}}}, "spec.speculative.profiles"),
    ({"speculative": {"method": ""}}, "spec.speculative.method"),
    ({"maxModelLen": "huge"}, "spec.maxModelLen"),
    ({"maxModelLen": 0}, "spec.maxModelLen"),
    ({"extraArgs": ["--port=9000"]}, "spec.extraArgs"),
    ({"extraArgs": ["--speculative-config", "{}"]}, "spec.extraArgs"),
    ({"extraArgs": ["-sc.method", "ngram"]}, "spec.extraArgs"),  # every spelling (CEL)
    ({"rollback": {"minHitRate": 1.5}}, "spec.rollback.minHitRate"),
    ({"rollback": {"maxErrorPropagationRate": -0.1}}, "spec.rollback.maxErrorPropagationRate"),
    ({"rollback": {"cooldownSeconds": -5}}, "spec.rollback.cooldownSeconds"),
    ({"gpuProducts": [""]}, "spec.gpuProducts"),
    ({"foo": "bar"}, "spec.foo"),
]


@pytest.mark.parametrize(("patch", "field"), REFUSED, ids=[f for _, f in REFUSED])
def test_api_server_refuses_invalid_spec_naming_the_field(kubectl, namespace, crd_installed,
                                                          patch, field):
    spec = {"model": "m", **patch}
    spec = {k: v for k, v in spec.items() if v is not None}
    doc = yaml.safe_dump({"apiVersion": "mtp-operator.io/v1alpha1", "kind": "MTPInference",
                          "metadata": {"name": "bad"}, "spec": spec})
    p = kubectl("apply", "-n", namespace, "--dry-run=server", "-f", "-", input=doc, check=False)
    assert p.returncode != 0, f"accepted: {spec}"
    assert field in p.stderr, p.stderr


# Accepted by the API server but not servable: the operator reports and keeps the pools.
REPORTED = [
    ({"speculative": {"method": "eagle"}}, "speculative.method", "InvalidSpec"),
    ({"speculative": {"mtpLayers": 2, "profiles": {"NVIDIA-H100-80GB-HBM3": 3}}},
     "speculative.profiles[NVIDIA-H100-80GB-HBM3]", "InvalidSpec"),
    ({"tensorParallelSize": 16}, "nvidia.com/gpu", "NoFittingNodes"),
    ({"gpuProducts": ["NVIDIA-B300"]}, "gpuProducts", "NoFittingNodes"),
]


def test_operator_reports_unservable_edits_and_keeps_serving_pools(kubectl, namespace, operator):
    apply(kubectl, namespace, mtpi("keep"))
    wait_ready(kubectl, namespace, "keep")
    serving = {p: d["metadata"]["uid"] for p, d in pools(kubectl, namespace).items()}
    hashes = {p: d["metadata"]["annotations"]["mtp-operator.io/settings-hash"]
              for p, d in pools(kubectl, namespace).items()}
    for patch, field, reason in REPORTED:
        apply(kubectl, namespace, mtpi("keep", **patch))

        def reported(reason=reason):
            obj = resource(kubectl, namespace, "keep")
            deg = condition(obj, "Degraded")
            gen_ok = obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
            return obj if gen_ok and deg.get("reason") == reason else None

        obj = wait_for(reported, 30, message=f"{reason} for {patch}")
        assert field in condition(obj, "Degraded")["message"], (patch, obj["status"])
        now = pools(kubectl, namespace)
        assert {p: d["metadata"]["uid"] for p, d in now.items()} == serving, patch
        assert {p: d["metadata"]["annotations"]["mtp-operator.io/settings-hash"]
                for p, d in now.items()} == hashes, patch
    events = get_json(kubectl, "events", "-n", namespace)["items"]
    assert any(e["reason"] == "InvalidSpec" and "speculative.method" in e["message"]
               for e in events)
    apply(kubectl, namespace, mtpi("keep"))  # fixed again: Ready, same pools
    wait_ready(kubectl, namespace, "keep")
    assert {p: d["metadata"]["uid"] for p, d in pools(kubectl, namespace).items()} == serving


def test_delete_garbage_collects_everything(kubectl, namespace, operator):
    apply(kubectl, namespace, mtpi("gone"))
    wait_ready(kubectl, namespace, "gone")
    assert len(pools(kubectl, namespace)) == 4
    kubectl("delete", "mtpi", "gone", "-n", namespace)
    wait_for(lambda: not get_json(kubectl, "deployments", "-n", namespace)["items"]
             and not get_json(kubectl, "services", "-n", namespace)["items"], 60,
             message="pools garbage-collected")


def test_hand_edit_of_a_pool_is_reverted(kubectl, namespace, operator):
    apply(kubectl, namespace, mtpi("edit", speculative={"numSpeculativeTokens": 2}))
    wait_ready(kubectl, namespace, "edit")
    dep = pools(kubectl, namespace)["NVIDIA-L40S"]
    name = dep["metadata"]["name"]
    kubectl("scale", "deployment", name, "-n", namespace, "--replicas=3")
    kubectl("set", "image", f"deployment/{name}", "-n", namespace, "vllm=example.com/other:1")
    wait_for(lambda: (d := pools(kubectl, namespace)["NVIDIA-L40S"])["spec"]["replicas"] == 1
             and d["spec"]["template"]["spec"]["containers"][0]["image"]
             == dep["spec"]["template"]["spec"]["containers"][0]["image"], 30,
             message="hand edit reverted")
    events = get_json(kubectl, "events", "-n", namespace)["items"]
    assert any(e["reason"] == "ManualChangeReverted" for e in events)
