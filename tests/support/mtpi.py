"""Small helpers for tests that drive MTPInference resources through kubectl (real sandbox)."""

from __future__ import annotations

from typing import Any

import yaml

from support.cluster_fixtures import get_json, wait_for

H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
A100 = "NVIDIA-A100-SXM4-80GB"
L40S = "NVIDIA-L40S"
PRODUCTS = (A100, H100, H200, L40S)

ANNOTATION_RESET = "mtp-operator.io/reset-rollback"


def manifest(name: str, **spec: Any) -> str:
    spec.setdefault("model", "deepseek-ai/DeepSeek-V3")
    return yaml.safe_dump(
        {"apiVersion": "mtp-operator.io/v1alpha1", "kind": "MTPInference",
         "metadata": {"name": name}, "spec": spec}
    )


def apply(kubectl, namespace: str, name: str, **spec: Any) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=manifest(name, **spec))


def resource(kubectl, namespace: str, name: str) -> dict:
    return get_json(kubectl, "mtpi", name, "-n", namespace)


def condition(obj: dict, ctype: str) -> dict:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c
    return {}


def pool(obj: dict, product: str) -> dict:
    for p in (obj.get("status") or {}).get("pools") or []:
        if p["gpuProduct"] == product:
            return p
    raise KeyError(f"no pool {product} in {obj['metadata']['name']}'s status")


def pool_ks(obj: dict) -> dict[str, int]:
    return {p["gpuProduct"]: p["numSpeculativeTokens"] for p in obj["status"]["pools"]}


def wait_ready(kubectl, namespace: str, name: str, timeout: float = 90) -> dict:
    def ready():
        obj = resource(kubectl, namespace, name)
        st = obj.get("status") or {}
        gen = obj["metadata"]["generation"]
        return obj if st.get("phase") == "Ready" and st.get("observedGeneration") == gen else None

    return wait_for(ready, timeout, message=f"{name} Ready")


def deployments(kubectl, namespace: str, name: str | None = None) -> dict[str, dict]:
    """{gpu product: Deployment} of one resource (or of all, when only one exists)."""
    selector = ["-l", f"mtp-operator.io/mtpinference={name}"] if name else []
    items = get_json(kubectl, "deployments", "-n", namespace, *selector)["items"]
    return {d["metadata"]["annotations"]["mtp-operator.io/gpu-product"]: d for d in items}


def settings_hashes(deps: dict[str, dict]) -> dict[str, str]:
    return {p: d["metadata"]["annotations"]["mtp-operator.io/settings-hash"]
            for p, d in deps.items()}


def runtime_k(dep: dict) -> int:
    """K in the pod template's MTP_RUNTIME_CONFIG (what the runtime in the pod will run)."""
    import json

    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    value = next(e["value"] for e in env if e["name"] == "MTP_RUNTIME_CONFIG")
    return int(json.loads(value)["serve"]["num_speculative_tokens"])


def events(kubectl, namespace: str, reason: str, name: str | None = None) -> list[dict]:
    items = get_json(kubectl, "events", "-n", namespace)["items"]
    return [e for e in items if e.get("reason") == reason
            and (name is None or e["involvedObject"].get("name") == name)]


def metric(op: Any, name: str, **labels: str) -> float:
    """Sum of the samples of `name` on the operator's /metrics whose labels include `labels`."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(op.url("/metrics"), timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def check_one_pool_rolled_back(kubectl, namespace: str, name: str, product: str, *,
                               ks: dict[str, int], hashes: dict[str, str], to_k: int,
                               via: str, spec_before: dict, generation: int) -> dict:
    """After a rollback of `product`'s pool to `to_k`: only that pool changed (Deployment,
    runtime config, status), the record, condition and Event say why and through which way in,
    and the spec is untouched. Returns the resource."""
    from support.pool_fakes import deployment_k

    deps = deployments(kubectl, namespace)
    assert deployment_k(deps[product]) == to_k and runtime_k(deps[product]) == to_k
    now_hashes = settings_hashes(deps)
    assert {p for p in hashes if hashes[p] != now_hashes[p]} == {product}

    obj = wait_for(lambda: (o := resource(kubectl, namespace, name))["status"].get(
        "rollbacks") and o, 10, message="rollback in status")
    (record,) = obj["status"]["rollbacks"]
    assert record["gpuProduct"] == product
    assert (record["fromK"], record["toK"]) == (ks[product], to_k)
    assert record["via"] == via
    assert record["alert"] in ("MTPHitRateLow", "MTPErrorPropagationHigh")
    if record["alert"] == "MTPHitRateLow":
        assert record["value"] < record["threshold"] == 0.88
    else:
        assert record["value"] > record["threshold"] == 0.40
    rolled_pool = pool(obj, product)
    assert (rolled_pool["numSpeculativeTokens"], rolled_pool["source"],
            rolled_pool["rollbackK"]) == (to_k, "rollback", to_k)
    assert pool_ks(obj) == {**ks, product: to_k}
    rolled = condition(obj, "SpeculationRolledBack")
    assert rolled["status"] == "True" and rolled["reason"] == "RolledBack"
    assert product in rolled["message"]
    (event,) = events(kubectl, namespace, "SpeculationRolledBack", name)
    assert event["type"] == "Warning" and product in event["message"]
    assert f"via {via}" in event["message"]
    assert obj["spec"] == spec_before and obj["metadata"]["generation"] == generation
    return obj
