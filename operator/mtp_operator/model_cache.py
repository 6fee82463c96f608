"""A resource's model cache: which one applies, what it adds to the pods, what is wrong with it.

Pure. The cache is `spec.modelCache`, else the operator's default (settings
`modelCache.default`), else none. Its volume is mounted at MODEL_CACHE_MOUNT_PATH in every pod
of every pool, and the pool configuration tells the runtime, which points the hub client
there (mtp_runtime.model_cache).

A hostPath cache is keyed by namespace (issue 36): the volume is the allowed folder that holds
the resource's path (`modelCache.allowedHostPaths`, the most specific one) and the pod mounts
only `<path below it>/<namespace>` of it (a volumeMount subPath), so a pool sees its own
namespace's folder and nothing else. kubelet resolves a subPath on the node inside its volume
and refuses one that a symbolic link leads out of, so a link planted under the allowed folder
cannot point the mount anywhere else; the runtime checks the folders it uses inside the mount
(`MTP_RUNTIME_CACHE_ROOT`, mtp_runtime.cache_files.check_confined). The cluster admin may share
one folder across namespaces (`modelCache.shareHostPathAcrossNamespaces`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from mtp_operator.api.v1alpha1 import MODEL_CACHE_MOUNT_PATH, ModelCacheSpec, MTPInferenceSpec
from mtp_operator.settings import ModelCacheSettings
from mtp_runtime.model_cache import ModelCache
from mtp_runtime.problems import Problem

VOLUME_NAME = "model-cache"
# Variables the runtime sets from the cache; set in spec.env they would point elsewhere.
CACHE_ENV = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_XET_CACHE", "MODELSCOPE_CACHE")


@dataclass(frozen=True)
class EffectiveCache:
    spec: ModelCacheSpec  # never `none`
    from_default: bool  # taken from the operator's settings, not from the resource
    # hostPath only: the node folder the volume is (an allowed folder), and the folder below
    # it the pod mounts ("" : the volume itself)
    host_root: str | None = None
    sub_path: str = ""

    @property
    def runtime(self) -> ModelCache:
        return ModelCache(MODEL_CACHE_MOUNT_PATH, self.spec.kind, self.spec.read_only)  # type: ignore[arg-type]


def effective(
    spec: MTPInferenceSpec, settings: ModelCacheSettings, namespace: str
) -> EffectiveCache | None:
    """The cache the pools of a resource in `namespace` use, or None (no cache volume)."""
    chosen, from_default = spec.model_cache, False
    if chosen is None:
        chosen, from_default = settings.default, True
    if chosen is None or chosen.none is not None:
        return None
    if chosen.host_path is None:
        return EffectiveCache(chosen, from_default)
    path = posixpath.normpath(chosen.host_path.path)
    root = allowed_root(path, settings.allowed_host_paths) or path  # else refused anyway
    below = "" if path == root else posixpath.relpath(path, root)
    if not settings.share_host_path_across_namespaces:
        below = posixpath.join(below, namespace) if below else namespace
    return EffectiveCache(chosen, from_default, root, below)


def volume(cache: EffectiveCache) -> dict[str, Any]:
    c = cache.spec
    if c.persistent_volume_claim is not None:
        source: dict[str, Any] = {"claimName": c.persistent_volume_claim.claim_name}
        if c.read_only:
            source["readOnly"] = True
        return {"name": VOLUME_NAME, "persistentVolumeClaim": source}
    assert c.host_path is not None and cache.host_root is not None
    # a read-only cache must exist already; a writable one is created on first use (kubelet
    # makes the subPath folders below it)
    kind = "Directory" if c.read_only else "DirectoryOrCreate"
    return {"name": VOLUME_NAME, "hostPath": {"path": cache.host_root, "type": kind}}


def volume_mount(cache: EffectiveCache) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": VOLUME_NAME, "mountPath": MODEL_CACHE_MOUNT_PATH}
    if cache.sub_path:
        mount["subPath"] = cache.sub_path
    if cache.spec.read_only:
        mount["readOnly"] = True
    return mount


def allowed_root(path: str, allowed: Iterable[str]) -> str | None:
    """The most specific of `allowed` that `path` is or is below (normalised), or None."""
    clean = posixpath.normpath(path)
    best: str | None = None
    for root in allowed:
        base = posixpath.normpath(root)
        if clean == base or clean.startswith(base.rstrip("/") + "/"):
            if best is None or len(base) > len(best):
                best = base
    return best


def path_allowed(path: str, allowed: Iterable[str]) -> bool:
    """`path` is one of `allowed` or below one (compared as normalised paths)."""
    return allowed_root(path, allowed) is not None


def cache_problems(
    spec: MTPInferenceSpec,
    settings: ModelCacheSettings,
    claim_exists: Callable[[str], bool] | None = None,
    namespace: str = "",
) -> list[Problem]:
    """What keeps the cache from being used: a hostPath outside the allowed folders, a claim
    that does not exist (when `claim_exists` can tell), settings it would contradict."""
    cache = effective(spec, settings, namespace)
    if cache is None:
        return []
    where = " (the operator's default modelCache)" if cache.from_default else ""
    found: list[Problem] = []
    c = cache.spec
    if c.host_path is not None and not path_allowed(c.host_path.path, settings.allowed_host_paths):
        allowed = ", ".join(settings.allowed_host_paths)
        reason = (
            f"only under {allowed}" if allowed else "none: hostPath caches are disabled"
        )
        found.append(
            Problem(
                "modelCache.hostPath.path",
                f"{c.host_path.path}{where} is not allowed: the operator's settings "
                f"(modelCache.allowedHostPaths) allow {reason}",
            )
        )
    if c.persistent_volume_claim is not None and claim_exists is not None:
        claim = c.persistent_volume_claim.claim_name
        if not claim_exists(claim):
            in_ns = f" in namespace {namespace}" if namespace else ""
            found.append(
                Problem(
                    "modelCache.persistentVolumeClaim.claimName",
                    f"PersistentVolumeClaim {claim}{where} does not exist{in_ns}; create it "
                    "first (the operator does not make claims)",
                )
            )
    for var in spec.env or []:
        name = var.get("name") if isinstance(var, dict) else None
        if name in CACHE_ENV:
            found.append(Problem("env", f"{name} is set by the runtime from modelCache; remove it"))
    for arg in spec.extra_args or []:
        if arg.split("=", 1)[0].replace("_", "-") == "--download-dir":
            found.append(Problem("extraArgs", "--download-dir would bypass modelCache; remove it"))
    return found
