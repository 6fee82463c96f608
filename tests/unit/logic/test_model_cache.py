"""spec.modelCache: the API's rules, which cache applies (resource or operator default), what it
adds to the pool pods, and the problems that make a resource Invalid. (The CEL rules run on a
real API server in tests/cluster/test_model_cache.py.)"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mtp_operator import builders
from mtp_operator.api.crd import crd
from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.model_cache import cache_problems, effective, path_allowed
from mtp_operator.planning import plan_pool
from mtp_operator.render import RenderError, render_resource
from mtp_operator.settings import (
    ModelCacheSettings,
    OperatorSettings,
    SettingsFileError,
    load_settings,
)
from mtp_operator.validation import spec_problems
from mtp_runtime.model_cache import ModelCache
from mtp_runtime.pool_config import ENV_VAR, PoolConfig
from support.fake_cluster import FakeKube, FakeView, mtpinference, node

PVC = {"persistentVolumeClaim": {"claimName": "weights"}}
HOST = {"hostPath": {"path": "/var/lib/mtp-models/qwen"}}
ALLOW = ModelCacheSettings(allowed_host_paths=["/var/lib/mtp-models"])


def _spec(**fields: Any) -> MTPInferenceSpec:
    return MTPInferenceSpec.model_validate({"model": "org/model", **fields})


def _problems(cache: Any) -> list[tuple[str, str]]:
    return spec_problems({"model": "org/model", "modelCache": cache})[1]


def _pod(spec: MTPInferenceSpec, settings: ModelCacheSettings) -> dict[str, Any]:
    plan = plan_pool(spec, "NVIDIA-H200")
    deploy = builders.pool_deployment(
        "res", "ns", "uid", spec, plan, "img:1", {}, effective(spec, settings, "ns")
    )
    return deploy["spec"]["template"]["spec"]


def _config(pod: dict[str, Any]) -> PoolConfig:
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    return PoolConfig.from_json(env[ENV_VAR])


# ---- the API --------------------------------------------------------------------------------

@pytest.mark.parametrize("cache", [PVC, HOST, {"none": {}}, {**PVC, "readOnly": True}])
def test_valid_caches(cache: dict[str, Any]) -> None:
    assert _problems(cache) == []


@pytest.mark.parametrize(
    ("cache", "field", "words"),
    [
        ({}, "modelCache", "exactly one of"),
        ({"readOnly": True}, "modelCache", "exactly one of"),
        ({**PVC, **HOST}, "modelCache", "exactly one of"),
        ({**PVC, "none": {}}, "modelCache", "exactly one of"),
        ({"none": {}, "readOnly": True}, "modelCache", "readOnly needs a cache volume"),
        ({"hostPath": {"path": "var/cache"}}, "modelCache.hostPath.path", "pattern"),
        ({"hostPath": {"path": "/var/../etc"}}, "modelCache.hostPath.path", "`..`"),
        ({"persistentVolumeClaim": {"claimName": "Bad_Name"}},
         "modelCache.persistentVolumeClaim.claimName", "pattern"),
        ({"persistentVolumeClaim": {}}, "modelCache.persistentVolumeClaim.claimName",
         "required"),
        ({"none": {"x": 1}}, "modelCache.none.x", "not permitted"),
        ({"nfs": {"server": "x"}}, "modelCache.nfs", "not permitted"),
    ],
)
def test_invalid_caches_name_the_field(cache: Any, field: str, words: str) -> None:
    found = _problems(cache)
    assert any(f == field and words in m for f, m in found), found


# ---- which cache applies --------------------------------------------------------------------

def test_no_cache_anywhere_is_none() -> None:
    assert effective(_spec(), ModelCacheSettings(), "ns") is None


def test_the_operator_default_applies_to_resources_without_one() -> None:
    settings = ModelCacheSettings.model_validate({"default": PVC})
    cache = effective(_spec(), settings, "ns")
    assert cache is not None and cache.from_default
    assert cache.runtime == ModelCache("/model-cache", "persistentVolumeClaim", False)


def test_a_resource_overrides_the_default_and_none_turns_it_off() -> None:
    settings = ModelCacheSettings.model_validate({"default": PVC})
    own = effective(_spec(modelCache=HOST), settings, "ns")
    assert own is not None and not own.from_default and own.spec.host_path is not None
    assert effective(_spec(modelCache={"none": {}}), settings, "ns") is None


# ---- what it adds to the pods ---------------------------------------------------------------

def test_no_cache_leaves_the_pod_as_it_was() -> None:
    pod = _pod(_spec(), ModelCacheSettings())
    assert [v["name"] for v in pod["volumes"]] == ["dshm"]
    assert [m["name"] for m in pod["containers"][0]["volumeMounts"]] == ["dshm"]
    assert _config(pod).model_cache is None


@pytest.mark.parametrize(
    ("cache", "volume", "mount_ro"),
    [
        (PVC, {"persistentVolumeClaim": {"claimName": "weights"}}, False),
        ({**PVC, "readOnly": True},
         {"persistentVolumeClaim": {"claimName": "weights", "readOnly": True}}, True),
        # a hostPath volume is the allowed folder itself; the pool's folder is a subPath
        (HOST, {"hostPath": {"path": "/var/lib/mtp-models", "type": "DirectoryOrCreate"}},
         False),
        ({**HOST, "readOnly": True},
         {"hostPath": {"path": "/var/lib/mtp-models", "type": "Directory"}}, True),
    ],
)
def test_cache_volume_mount_and_runtime_config(
    cache: dict[str, Any], volume: dict[str, Any], mount_ro: bool
) -> None:
    pod = _pod(_spec(modelCache=cache), ALLOW)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"] == {"name": "model-cache", **volume}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["model-cache"]["mountPath"] == "/model-cache"
    assert mounts["model-cache"].get("readOnly", False) is mount_ro
    kind = "persistentVolumeClaim" if "persistentVolumeClaim" in cache else "hostPath"
    assert _config(pod).model_cache == ModelCache("/model-cache", kind, mount_ro)


def _cache_mount(pod: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model-cache")


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}


def test_a_host_path_cache_is_keyed_by_namespace() -> None:
    """Each namespace gets its own folder below the resource's path (the pod sees only that
    folder): one tenant cannot write another's weights. The volume is the allowed folder, so
    kubelet resolves the whole subPath, the resource's own part included, inside it and
    refuses a symbolic link that leads out."""
    spec = _spec(modelCache=HOST)
    plan = plan_pool(spec, "NVIDIA-H200")
    pods = {}
    for ns in ("team-a", "team-b"):
        deploy = builders.pool_deployment("res", ns, "uid", spec, plan, "img:1", {},
                                          effective(spec, ALLOW, ns))
        pods[ns] = deploy["spec"]["template"]["spec"]
    for ns, pod in pods.items():
        assert _cache_mount(pod) == {"name": "model-cache", "mountPath": "/model-cache",
                                     "subPath": f"qwen/{ns}"}
        volume = next(v for v in pod["volumes"] if v["name"] == "model-cache")
        assert volume["hostPath"]["path"] == "/var/lib/mtp-models"
        assert _env(pod)["MTP_RUNTIME_CACHE_ROOT"] == "/model-cache"
    # a path that is an allowed folder itself: the namespace alone
    root = _spec(modelCache={"hostPath": {"path": "/var/lib/mtp-models"}})
    assert _cache_mount(_pod(root, ALLOW))["subPath"] == "ns"
    # the most specific allowed folder is the volume
    nested = ModelCacheSettings(allowed_host_paths=["/var/lib", "/var/lib/mtp-models/"])
    pod = _pod(spec, nested)
    volume = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    assert volume["hostPath"]["path"] == "/var/lib/mtp-models"
    assert _cache_mount(pod)["subPath"] == "qwen/ns"


def test_the_admin_may_share_a_host_path_cache_across_namespaces() -> None:
    shared = ModelCacheSettings(allowed_host_paths=["/var/lib/mtp-models"],
                                share_host_path_across_namespaces=True)
    spec = _spec(modelCache=HOST)
    plan = plan_pool(spec, "NVIDIA-H200")
    pods = [builders.pool_deployment("res", ns, "uid", spec, plan, "img:1", {},
                                     effective(spec, shared, ns))["spec"]["template"]["spec"]
            for ns in ("team-a", "team-b")]
    assert pods[0] == pods[1]  # one folder for both
    assert _cache_mount(pods[0]) == {"name": "model-cache", "mountPath": "/model-cache",
                                     "subPath": "qwen"}
    root = _spec(modelCache={"hostPath": {"path": "/var/lib/mtp-models"}})
    assert "subPath" not in _cache_mount(_pod(root, shared))
    loaded = ModelCacheSettings.model_validate({"allowedHostPaths": ["/srv"],
                                                "shareHostPathAcrossNamespaces": True})
    assert loaded.share_host_path_across_namespaces


def test_a_claim_cache_pod_is_as_before() -> None:
    """The namespace key and the cache root variable are for hostPath only: a claim's pods
    (and their settings hash) are what they were, so claim pools do not roll."""
    pod = _pod(_spec(modelCache=PVC), ModelCacheSettings())
    assert _cache_mount(pod) == {"name": "model-cache", "mountPath": "/model-cache"}
    assert "MTP_RUNTIME_CACHE_ROOT" not in _env(pod)


def test_the_cache_root_variable_is_reserved() -> None:
    found = spec_problems({"model": "org/model",
                           "env": [{"name": "MTP_RUNTIME_CACHE_ROOT", "value": "/"}]})[1]
    assert any(f.startswith("env") and "MTP_RUNTIME_CACHE_ROOT" in m for f, m in found), found
    # and the API server refuses it too (the CRD's CEL rule on env names)
    def rules(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [r["rule"] for r in node.get("x-kubernetes-validations", [])]
            return found + [r for v in node.values() for r in rules(v)]
        return [r for v in node for r in rules(v)] if isinstance(node, list) else []

    (env_rule,) = [r for r in rules(crd()) if r.startswith("!(self.name in [")]
    assert "'MTP_RUNTIME_CACHE_ROOT'" in env_rule


def test_a_cache_change_restarts_the_pool_and_a_k_change_keeps_the_cache() -> None:
    plain = _pod(_spec(), ModelCacheSettings())
    cached = _pod(_spec(modelCache=PVC), ModelCacheSettings())
    assert builders.settings_hash(plain) != builders.settings_hash(cached)
    k2 = _pod(_spec(modelCache=PVC, speculative={"numSpeculativeTokens": 2}), ModelCacheSettings())
    assert [v for v in k2["volumes"] if v["name"] == "model-cache"] == [
        v for v in cached["volumes"] if v["name"] == "model-cache"
    ]


# ---- problems the operator reports ----------------------------------------------------------

@pytest.mark.parametrize(
    ("path", "allowed", "ok"),
    [
        ("/var/lib/mtp-models", ["/var/lib/mtp-models"], True),
        ("/var/lib/mtp-models/a/b", ["/var/lib/mtp-models/"], True),
        ("/var/lib/mtp-models-evil", ["/var/lib/mtp-models"], False),
        ("/var/lib/mtp-models/./x", ["/var/lib/mtp-models"], True),
        ("/etc", ["/var/lib/mtp-models"], False),
        ("/var/lib/mtp-models", [], False),
    ],
)
def test_path_allowed(path: str, allowed: list[str], ok: bool) -> None:
    assert path_allowed(path, allowed) is ok


def test_a_host_path_outside_the_allowed_folders_is_refused() -> None:
    found = cache_problems(_spec(modelCache={"hostPath": {"path": "/etc"}}), ALLOW)
    assert found == [("modelCache.hostPath.path", "/etc is not allowed: the operator's settings "
                      "(modelCache.allowedHostPaths) allow only under /var/lib/mtp-models")]
    off = cache_problems(_spec(modelCache=HOST), ModelCacheSettings())
    assert off[0][0] == "modelCache.hostPath.path" and "hostPath caches are disabled" in off[0][1]
    assert cache_problems(_spec(modelCache=HOST), ALLOW) == []


def test_a_missing_claim_is_refused_only_when_it_is_missing() -> None:
    spec = _spec(modelCache=PVC)
    seen: list[str] = []

    def exists(name: str) -> bool:
        seen.append(name)
        return name == "other"

    found = cache_problems(spec, ModelCacheSettings(), exists, "team-a")
    assert seen == ["weights"]
    assert found == [("modelCache.persistentVolumeClaim.claimName",
                      "PersistentVolumeClaim weights does not exist in namespace team-a; "
                      "create it first (the operator does not make claims)")]
    assert cache_problems(spec, ModelCacheSettings(), lambda n: n == "weights", "team-a") == []


def test_a_default_cache_problem_says_it_is_the_default() -> None:
    settings = ModelCacheSettings.model_validate({"default": PVC})
    ((field, message),) = cache_problems(_spec(), settings, lambda n: False, "ns")
    assert field == "modelCache.persistentVolumeClaim.claimName"
    assert "(the operator's default modelCache)" in message


def test_settings_that_would_bypass_the_cache_are_refused() -> None:
    spec = _spec(
        modelCache=PVC,
        env=[{"name": "HF_HUB_CACHE", "value": "/tmp"}, {"name": "HF_TOKEN", "value": "x"}],
        extraArgs=["--download_dir=/tmp", "--enforce-eager"],
    )
    assert cache_problems(spec, ModelCacheSettings()) == [
        ("env", "HF_HUB_CACHE is set by the runtime from modelCache; remove it"),
        ("extraArgs", "--download-dir would bypass modelCache; remove it"),
    ]
    # without a cache the same settings are the user's business
    assert cache_problems(_spec(env=spec.env, extraArgs=spec.extra_args), ModelCacheSettings()) \
        == []


def test_render_reports_cache_problems_and_renders_the_default() -> None:
    doc = {"kind": "MTPInference", "metadata": {"name": "r"},
           "spec": {"model": "org/m", "modelCache": {"hostPath": {"path": "/etc"}}}}
    with pytest.raises(RenderError, match=r"modelCache\.hostPath\.path: /etc is not allowed"):
        render_resource(doc, ["NVIDIA-H200"])
    settings = OperatorSettings.model_validate({"modelCache": {"default": PVC}})
    doc["spec"] = {"model": "org/m"}
    _, deploy = render_resource(doc, ["NVIDIA-H200"], settings)
    volumes = deploy["spec"]["template"]["spec"]["volumes"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "weights"}} in volumes


def test_settings_file(tmp_path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text("modelCache:\n  default: {hostPath: {path: /srv/m}}\n"
                    "  allowedHostPaths: [/srv]\n")
    got = load_settings(path).model_cache
    assert got.allowed_host_paths == ["/srv"] and got.default is not None
    assert got.default.host_path is not None and got.default.host_path.path == "/srv/m"
    for bad in ("modelCache: {allowedHostPaths: [srv]}\n",
                "modelCache: {allowedHostPaths: [/a/../b]}\n",
                "modelCache: {default: {}}\n"):
        path.write_text(bad)
        with pytest.raises(SettingsFileError):
            load_settings(path)


# ---- the reconciler (in-memory cluster) -----------------------------------------------------

async def test_reconciler_waits_for_the_claim_and_keeps_the_pools() -> None:
    kube, view = FakeKube(), FakeView(nodes=[node("h1", "NVIDIA-H200")])
    key = view.add(mtpinference("res", {"model": "org/model"}))
    now = datetime(2026, 12, 1, tzinfo=UTC)
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: now)
    await rec.reconcile(key)
    view.deliver(kube, ready=True)
    serving = kube.deployments()
    applies = kube.count("apply")

    view.resources[key]["spec"] = {"model": "org/model", "modelCache": PVC}
    view.resources[key]["metadata"]["generation"] = 2
    await rec.reconcile(key)
    status = kube.statuses[key]
    assert status["phase"] == "Invalid"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec"
    assert degraded["message"].startswith(
        "modelCache.persistentVolumeClaim.claimName: PersistentVolumeClaim weights does not "
        f"exist in namespace {key[0]}"
    )
    assert kube.count("apply") == applies and kube.deployments() == serving

    view.claims.add((key[0], "weights"))  # the user creates the claim
    view.deliver(kube, ready=True)
    await rec.reconcile(key)
    (pool,) = kube.deployments().values()
    pod = pool["spec"]["template"]["spec"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "weights"}} in \
        pod["volumes"]
    assert kube.statuses[key]["phase"] != "Invalid"
