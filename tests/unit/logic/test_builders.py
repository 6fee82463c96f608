"""builders.py: the Deployment and Service the operator applies, checked against golden files
(one per example and sandbox GPU product) and by targeted asserts.

Golden files live in tests/fixtures/golden/<example>/<product>.yaml (the Service, then the
pool Deployment, as `render` prints them). After an intended change, review the diff and
rewrite them with

    UPDATE_GOLDEN=1 python -m pytest tests/unit/logic/test_builders.py
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtp_operator import builders
from mtp_operator.api.v1alpha1 import MTPInference, MTPInferenceSpec
from mtp_operator.naming import (
    ANNOTATION_COMMAND,
    ANNOTATION_GPU_PRODUCT,
    ANNOTATION_SETTINGS_HASH,
    LABEL_GPU_PRODUCT,
    LABEL_OWNER_UID,
    LABEL_RESOURCE,
    MAX_NAME,
    label_value,
    pool_deployment_name,
    pool_labels,
    pool_selector,
    service_name,
)
from mtp_operator.planning import plan_pool
from mtp_operator.render import PLACEHOLDER_UID, render_resource
from mtp_operator.settings import OperatorSettings
from mtp_runtime.drain import DRAIN_SECONDS_ENV, STOP_MARGIN_S
from mtp_runtime.model_cache import ModelCache
from mtp_runtime.pool_config import ENV_VAR, PoolConfig
from mtp_runtime.vllm_command import build_argv

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
GOLDEN = REPO / "tests" / "fixtures" / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

PRODUCTS = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-L40S"]
GOLDEN_EXAMPLES = ["qwen3.6-27b", "deepseek-v3-auto", "deepseek-v3-cached"]
# A fixed image, so that releasing a new version doesn't change the golden files.
SETTINGS = OperatorSettings(default_image="ghcr.io/mtp-operator/mtp-runtime:golden")

# K each pool must get, and where from (the examples' comments say why).
EXPECTED_K = {
    "qwen3.6-27b": {p: (2, "override") for p in PRODUCTS},
    "deepseek-v3-auto": {
        "NVIDIA-A100-SXM4-80GB": (4, "profile"),  # A100 profile 4, at the cap
        "NVIDIA-H100-80GB-HBM3": (4, "cap"),  # profile 6, maxSpeculativeTokens 4
        "NVIDIA-H200": (4, "cap"),  # profile 6, maxSpeculativeTokens 4
        "NVIDIA-L40S": (2, "profile"),
    },
}
EXPECTED_K["deepseek-v3-cached"] = EXPECTED_K["deepseek-v3-auto"]  # the same, plus a cache
SEED_ARGV = [
    "vllm", "serve", "Qwen/Qwen3.6-27B", "--port", "8000", "--tensor-parallel-size", "8",
    "--max-model-len", "262144", "--reasoning-parser", "qwen3",
    "--speculative-config", '{"method":"qwen3_next_mtp","num_speculative_tokens":2}',
]  # fmt: skip


def _example(stem: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / f"{stem}.yaml").read_text())


def _render(stem: str, product: str) -> list[dict[str, Any]]:
    return render_resource(_example(stem), [product], SETTINGS)


def _dump(objs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False, width=120)


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container["env"]}


def _spec(**fields: Any) -> MTPInferenceSpec:
    return MTPInferenceSpec.model_validate({"model": "org/model", **fields})


def _deployment(spec: MTPInferenceSpec, product: str, name: str = "res", **kw: Any) -> dict:
    plan = plan_pool(spec, product, kw.get("cluster_profiles"), kw.get("rollback_k"))
    return builders.pool_deployment(
        name, "ns", "uid-1", spec, plan, "img:1", kw.get("cluster_profiles")
    )


def _hash(deploy: dict[str, Any]) -> str:
    return deploy["metadata"]["annotations"][ANNOTATION_SETTINGS_HASH]


def _template_hash(deploy: dict[str, Any]) -> str:
    return deploy["spec"]["template"]["metadata"]["annotations"][ANNOTATION_SETTINGS_HASH]


# ---- golden files ---------------------------------------------------------------------------

GOLDEN_CASES = [(stem, product) for stem in GOLDEN_EXAMPLES for product in PRODUCTS]


@pytest.mark.parametrize(
    ("stem", "product"), GOLDEN_CASES, ids=[f"{s}/{p}" for s, p in GOLDEN_CASES]
)
def test_golden(stem: str, product: str) -> None:
    objs = _render(stem, product)
    path = GOLDEN / stem / f"{product}.yaml"
    text = _dump(objs)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run UPDATE_GOLDEN=1 pytest {__file__}"
    want = path.read_text()
    if list(yaml.safe_load_all(want)) != objs:
        diff = "\n".join(
            difflib.unified_diff(
                want.splitlines(), text.splitlines(), str(path), "rendered now", lineterm=""
            )
        )
        pytest.fail(
            f"{stem} on {product} no longer renders its golden file. If the change is intended, "
            f"review it and run UPDATE_GOLDEN=1 python -m pytest {__file__}\n{diff}"
        )


def test_no_stray_golden_files() -> None:
    found = {(p.parent.name, p.stem) for p in GOLDEN.glob("*/*.yaml")}
    assert found == set(GOLDEN_CASES)


@pytest.mark.parametrize(
    ("stem", "product"), GOLDEN_CASES, ids=[f"{s}/{p}" for s, p in GOLDEN_CASES]
)
def test_rendered_pool(stem: str, product: str) -> None:
    """What the golden files were reviewed for, asserted so a regenerated file can't hide it."""
    doc = _example(stem)
    name = doc["metadata"]["name"]
    spec = MTPInference.model_validate(doc).spec
    svc, deploy = _render(stem, product)
    k, source = EXPECTED_K[stem][product]

    # Service: one per resource, selects every pool, never named `vllm`
    assert svc["kind"] == "Service" and svc["metadata"]["name"] == f"{name}-openai"
    # ... and only the resource's own pods (issue 36): its UID is on every pod it makes
    assert svc["spec"]["selector"] == {LABEL_RESOURCE: name, LABEL_OWNER_UID: PLACEHOLDER_UID}
    assert deploy["spec"]["template"]["metadata"]["labels"][LABEL_OWNER_UID] == PLACEHOLDER_UID
    assert LABEL_OWNER_UID not in deploy["spec"]["selector"]["matchLabels"]  # immutable
    assert {(p["name"], p["port"]) for p in svc["spec"]["ports"]} == {
        ("http", 8000),
        ("metrics", 9400),
    }

    meta = deploy["metadata"]
    assert meta["name"] == pool_deployment_name(name, product)
    assert meta["labels"] == pool_labels(name, product)
    assert meta["labels"][LABEL_GPU_PRODUCT] == product
    owner = {
        "apiVersion": "mtp-operator.io/v1alpha1",
        "kind": "MTPInference",
        "name": name,
        "uid": PLACEHOLDER_UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert meta["ownerReferences"] == [owner] == svc["metadata"]["ownerReferences"]
    assert meta["annotations"][ANNOTATION_GPU_PRODUCT] == product

    # the command annotation is exactly the argv the runtime will run
    plan = plan_pool(spec, product)
    assert (plan.k, plan.source) == (k, source)
    argv = json.loads(meta["annotations"][ANNOTATION_COMMAND])
    assert argv == build_argv(plan.serve)
    assert meta["annotations"][ANNOTATION_COMMAND] == json.dumps(argv)
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": spec.speculative.method,
        "num_speculative_tokens": k,
    }
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"

    dspec = deploy["spec"]
    assert dspec["replicas"] == 1
    assert dspec["strategy"]["rollingUpdate"]["maxSurge"] == 0
    assert dspec["selector"]["matchLabels"] == pool_selector(name, product)
    template = dspec["template"]
    assert dspec["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    pod = template["spec"]
    assert pod["enableServiceLinks"] is False
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": [product]}
            ]
        }
    ]

    (container,) = pod["containers"]
    assert container["image"] == SETTINGS.default_image
    assert container["command"] == ["mtp-runtime", "serve"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(spec.tensor_parallel_size)
    env = _env(container)
    config = PoolConfig.from_json(env[ENV_VAR])
    assert config.gpu_product == product
    assert config.serve == plan.serve and config.serve.num_speculative_tokens == k
    assert config.k_mode == ("fixed" if stem == "qwen3.6-27b" else "auto")
    if spec.model_source == "modelscope":
        assert env["VLLM_USE_MODELSCOPE"] == "true"
    else:
        assert "VLLM_USE_MODELSCOPE" not in env

    # the model cache: the claim's volume at the fixed path, and the runtime told so
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    if spec.model_cache is None:
        assert "model-cache" not in volumes and "model-cache" not in mounts
        assert config.model_cache is None and '"model_cache"' not in env[ENV_VAR]
    else:
        claim = spec.model_cache.persistent_volume_claim
        assert claim is not None and mounts["model-cache"] == "/model-cache"
        assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": claim.claim_name}
        assert config.model_cache == ModelCache("/model-cache", "persistentVolumeClaim", False)


def test_seed_example_runs_the_seed_command() -> None:
    for product in PRODUCTS:
        _, deploy = _render("qwen3.6-27b", product)
        argv = json.loads(deploy["metadata"]["annotations"][ANNOTATION_COMMAND])
        assert argv == SEED_ARGV, product


def test_k_zero_has_no_speculative_config() -> None:
    spec = _spec(speculative={"numSpeculativeTokens": 0})
    deploy = _deployment(spec, "NVIDIA-H100-80GB-HBM3")
    argv = json.loads(deploy["metadata"]["annotations"][ANNOTATION_COMMAND])
    assert "--speculative-config" not in argv
    config = PoolConfig.from_json(
        _env(deploy["spec"]["template"]["spec"]["containers"][0])[ENV_VAR]
    )
    assert config.serve.num_speculative_tokens == 0
    # a profile entry of 0 turns speculation off on that GPU only
    spec = _spec(speculative={"profiles": {"L40S": 0}})
    off = json.loads(
        _deployment(spec, "NVIDIA-L40S")["metadata"]["annotations"][ANNOTATION_COMMAND]
    )
    on = json.loads(_deployment(spec, "NVIDIA-H200")["metadata"]["annotations"][ANNOTATION_COMMAND])
    assert "--speculative-config" not in off and "--speculative-config" in on


# ---- settings hash --------------------------------------------------------------------------


def test_settings_hash_is_stable() -> None:
    spec = _spec(speculative={"profiles": {"H100": 5}})
    a = _deployment(spec, "NVIDIA-H100-80GB-HBM3")
    b = _deployment(_spec(speculative={"profiles": {"H100": 5}}), "NVIDIA-H100-80GB-HBM3")
    assert a == b
    assert re.fullmatch(r"[0-9a-f]{16}", _hash(a))
    # the hash covers the pod spec only in its canonical form: dict order doesn't matter
    pod = a["spec"]["template"]["spec"]
    reordered = dict(reversed(list(copy.deepcopy(pod).items())))
    assert builders.settings_hash(reordered, 1) == builders.settings_hash(pod, 1) == _hash(a)


@pytest.mark.parametrize("replicas", [0, 1, 3])
def test_settings_hashes_keep_the_formula_running_pools_carry(replicas: int) -> None:
    """The digests are sha256 of json.dumps({"pod": pod spec, "replicas": n}, sort_keys=True)
    (the Deployment's annotation) and of {"pod": pod spec} (the pod template's), first 16 hex
    digits: pools written by earlier versions carry these, and a different digest for the
    same settings would rewrite (and restart) every pool on upgrade."""
    import hashlib

    dep = _deployment(_spec(replicas=replicas, speculative={"profiles": {"H100": 5}}),
                      "NVIDIA-H100-80GB-HBM3")
    pod = dep["spec"]["template"]["spec"]

    def digest(value: Any) -> str:
        return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]

    assert dep["spec"]["replicas"] == replicas
    assert _hash(dep) == digest({"pod": pod, "replicas": replicas})
    template = dep["spec"]["template"]["metadata"]["annotations"][ANNOTATION_SETTINGS_HASH]
    assert template == digest({"pod": pod})
    assert builders.settings_hashes(pod, replicas) == (_hash(dep), template)
    assert builders.settings_hash(pod) == template


@pytest.mark.parametrize(
    "change",
    [
        {"image": "other:2"},
        {"speculative": {"numSpeculativeTokens": 3}},
        {"tensorParallelSize": 2},
        {"maxModelLen": "32k"},
        {"extraArgs": ["--enforce-eager"]},
        {"env": [{"name": "HF_TOKEN", "value": "x"}]},
        {"nodeSelector": {"pool": "a"}},
        {"tolerations": [{"key": "k", "operator": "Exists"}]},
        {"modelSource": "modelscope"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_settings_hash_changes_with_the_pool_settings(change: dict[str, Any]) -> None:
    before = _deployment(_spec(), "NVIDIA-H200")
    after = _deployment(_spec(**change), "NVIDIA-H200")
    assert _hash(before) != _hash(after)
    assert _template_hash(before) != _template_hash(after)


def test_scaling_changes_the_deployment_hash_but_never_restarts_pods() -> None:
    one = _deployment(_spec(replicas=1), "NVIDIA-H200")
    three = _deployment(_spec(replicas=3), "NVIDIA-H200")
    assert three["spec"]["replicas"] == 3
    # the Deployment's own annotation (and status settingsHash) notice the new replica count
    assert _hash(one) != _hash(three)
    # the pod template is untouched: the Deployment controller rolls no pod
    assert one["spec"]["template"] == three["spec"]["template"]


def test_editing_one_products_profile_rolls_only_that_pool() -> None:
    def hashes(profiles: dict[str, int], cluster: dict[str, int]) -> dict[str, str]:
        spec = _spec(speculative={"profiles": profiles})
        return {p: _hash(_deployment(spec, p, cluster_profiles=cluster)) for p in PRODUCTS}

    base = hashes({"H100": 5, "NVIDIA-A100-SXM4-80GB": 3}, {"L40S": 1})
    assert hashes({"H100": 5, "NVIDIA-A100-SXM4-80GB": 3}, {"L40S": 1}) == base

    def changed(now: dict[str, str]) -> set[str]:
        return {p for p in PRODUCTS if now[p] != base[p]}

    # a family entry, an exact-product entry, an entry for a GPU no pool has
    assert changed(hashes({"H100": 4, "NVIDIA-A100-SXM4-80GB": 3}, {"L40S": 1})) == {
        "NVIDIA-H100-80GB-HBM3"
    }
    assert changed(hashes({"H100": 5, "NVIDIA-A100-SXM4-80GB": 2}, {"L40S": 1})) == {
        "NVIDIA-A100-SXM4-80GB"
    }
    assert changed(hashes({"H100": 5, "NVIDIA-A100-SXM4-80GB": 3, "T4": 1}, {"L40S": 1})) == set()
    # the cluster-wide table (operator settings) follows the same rule
    assert changed(hashes({"H100": 5, "NVIDIA-A100-SXM4-80GB": 3}, {"L40S": 2})) == {"NVIDIA-L40S"}
    assert changed(
        hashes({"H100": 5, "NVIDIA-A100-SXM4-80GB": 3}, {"L40S": 1, "NVIDIA-H200": 5})
    ) == {"NVIDIA-H200"}


def test_rollback_pin_is_fixed_k_in_the_pod() -> None:
    spec = _spec()
    deploy = _deployment(spec, "NVIDIA-H100-80GB-HBM3", rollback_k=3)
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    config = PoolConfig.from_json(_env(container)[ENV_VAR])
    assert (config.serve.num_speculative_tokens, config.k_mode) == (3, "fixed")
    assert _hash(deploy) != _hash(_deployment(spec, "NVIDIA-H100-80GB-HBM3"))


# ---- pod details ----------------------------------------------------------------------------


def test_resources_tolerations_env_and_node_selector_from_the_spec() -> None:
    spec = _spec(
        tensorParallelSize=4,
        resources={
            "limits": {"nvidia.com/gpu": 1, "memory": "200Gi"},
            "requests": {"nvidia.com/gpu": 1, "cpu": "8"},
        },
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml"}],
        env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}],
        nodeSelector={"pool": "inference"},
    )
    pod = _deployment(spec, "NVIDIA-H200")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # nvidia.com/gpu always follows tensorParallelSize; the rest is the user's
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "4", "memory": "200Gi"},
        "requests": {"nvidia.com/gpu": "4", "cpu": "8"},
    }
    assert spec.resources == {  # the spec object is not modified
        "limits": {"nvidia.com/gpu": 1, "memory": "200Gi"},
        "requests": {"nvidia.com/gpu": 1, "cpu": "8"},
    }
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml"},
    ]
    assert [e["name"] for e in container["env"]] == [ENV_VAR, DRAIN_SECONDS_ENV, "HF_TOKEN"]
    assert pod["nodeSelector"] == {"pool": "inference"}


def test_host_network_only_when_asked() -> None:
    pod = _deployment(_spec(), "NVIDIA-H200")["spec"]["template"]["spec"]
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod
    deploy = _deployment(_spec(hostNetwork=True), "NVIDIA-H200")
    pod = deploy["spec"]["template"]["spec"]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert _hash(deploy) != _hash(_deployment(_spec(), "NVIDIA-H200"))  # a settings change


@pytest.mark.parametrize("resources", [None, {}, {"limits": None}, {"requests": None}])
def test_gpu_limit_set_whatever_the_resources_say(resources: dict[str, Any] | None) -> None:
    spec = _spec(tensorParallelSize=2, resources=resources)
    container = _deployment(spec, "NVIDIA-H200")["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_desired_objects_service_first_then_one_deployment_per_plan() -> None:
    spec = _spec()
    plans = [plan_pool(spec, p) for p in PRODUCTS]
    objs = builders.desired_objects("res", "ns", "uid", spec, plans, "img:1")
    assert [o["kind"] for o in objs] == ["Service"] + ["Deployment"] * len(PRODUCTS)
    names = [o["metadata"]["name"] for o in objs]
    assert len(set(names)) == len(names)
    assert all(o["metadata"]["namespace"] == "ns" for o in objs)


# ---- names and labels -----------------------------------------------------------------------

LONG = "a-very-long-mtpinference-resource-name-for-a-model-with-many-words-in-it-v2"


def _name_ok(name: str) -> bool:
    return (
        len(name) <= MAX_NAME and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) is not None
    )


@pytest.mark.parametrize(
    "product", [*PRODUCTS, "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "NVIDIA-H200-SHARED"]
)
def test_long_names_fit_and_are_deterministic(product: str) -> None:
    spec = _spec()
    deploy = _deployment(spec, product, name=LONG)
    name = deploy["metadata"]["name"]
    assert _name_ok(name), name
    assert name == _deployment(spec, product, name=LONG)["metadata"]["name"]
    assert re.search(r"-[0-9a-f]{8}$", name), "a cut name ends in a hash"
    # two long names that share a long prefix still get distinct objects
    other = _deployment(spec, product, name=LONG + "x")["metadata"]["name"]
    assert other != name and _name_ok(other)
    for labels in (deploy["metadata"]["labels"], deploy["spec"]["selector"]["matchLabels"]):
        assert all(len(v) <= MAX_NAME for v in labels.values()), labels
    assert deploy["spec"]["selector"]["matchLabels"].items() <= (
        deploy["spec"]["template"]["metadata"]["labels"].items()
    )
    # the exact product is kept unabridged in an annotation
    assert deploy["metadata"]["annotations"][ANNOTATION_GPU_PRODUCT] == product


def test_long_service_name() -> None:
    svc = builders.service(LONG, "ns", "uid")
    assert _name_ok(svc["metadata"]["name"]) and svc["metadata"]["name"][0].isalpha()
    assert svc["metadata"]["name"] == service_name(LONG) != service_name(LONG + "x")
    assert all(len(v) <= MAX_NAME for v in svc["metadata"]["labels"].values())
    assert svc["spec"]["selector"] == {LABEL_RESOURCE: label_value(LONG), LABEL_OWNER_UID: "uid"}
    assert builders.label_only_service(svc)["spec"]["selector"] == {
        LABEL_RESOURCE: label_value(LONG)}


@pytest.mark.parametrize(
    ("resource", "want"),
    [
        ("qwen3-6-27b", "qwen3-6-27b-openai"),
        ("vllm", "vllm-openai"),  # never the bare `vllm` (VLLM_PORT injection)
        ("7b-chat", "mtpi-7b-chat-openai"),  # a Service name must start with a letter
        ("qwen3.6-27b", "qwen3-6-27b-openai"),  # dots are not allowed in a Service name
    ],
)
def test_service_names(resource: str, want: str) -> None:
    assert service_name(resource) == want
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", want)


def test_label_values_are_cut_with_a_hash() -> None:
    long_product = "NVIDIA-" + "X" * 80
    value = label_value(long_product)
    assert len(value) == MAX_NAME and value == label_value(long_product)
    assert value != label_value(long_product + "Y")
    assert label_value("NVIDIA-H200") == "NVIDIA-H200"
    deploy = _deployment(_spec(), long_product)
    assert deploy["metadata"]["labels"][LABEL_GPU_PRODUCT] == value
    assert _name_ok(deploy["metadata"]["name"])


@pytest.mark.parametrize("drain", [None, 0, 600])
def test_pool_pods_drain_before_they_stop(drain: int | None) -> None:
    """Issue 37: readiness is the runtime's /ready, the preStop is `mtp-runtime drain`, the
    drain timeout reaches the runtime, and the grace period covers it plus vLLM's stop."""
    spec = _spec() if drain is None else _spec(rollout={"drainSeconds": drain})
    seconds = spec.rollout.drain_seconds
    assert seconds == (120 if drain is None else drain)
    pods = [_deployment(spec, "NVIDIA-H200")["spec"]["template"]["spec"],
            builders.canary_pod("res", "ns", "uid", spec, plan_pool(spec, "NVIDIA-H200"),
                                "img:1")["spec"]]
    for pod in pods:
        (container,) = pod["containers"]
        assert pod["terminationGracePeriodSeconds"] == seconds + STOP_MARGIN_S
        assert container["lifecycle"]["preStop"]["exec"]["command"] == ["mtp-runtime", "drain"]
        probe = container["readinessProbe"]["httpGet"]
        assert (probe["path"], probe["port"]) == ("/ready", "metrics")
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[DRAIN_SECONDS_ENV] == str(seconds)


@pytest.mark.parametrize("bad", [-1, 3601, "x", 1.5])
def test_drain_seconds_out_of_bounds_names_the_field(bad: object) -> None:
    with pytest.raises(ValueError, match=r"rollout\.drainSeconds"):
        _spec(rollout={"drainSeconds": bad})
