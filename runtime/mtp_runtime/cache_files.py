"""The model cache's files: what is in it, the "loaded completely" marker, one start's plan.

The I/O half of `model_cache` (which decides from what this module reads). Standard library
only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mtp_runtime.model_cache import (
    CACHE_ROOT_ENV,
    MARKER_DIR,
    PARTIAL_SUFFIXES,
    Inventory,
    ModelCache,
    cache_env,
    compile_cache_env,
    hub_cache_dir,
    inside,
    marker_path,
    model_dir,
    offline_decision,
)


def is_local(model: str) -> bool:
    """A path (vLLM loads it as is), not a hub id."""
    return model.startswith(("/", "./", "../")) or Path(model).is_dir()


def inventory(folder: Path) -> Inventory:
    """Complete files under `folder` (symlinks are followed only to count them once:
    huggingface_hub's snapshots link to blobs, which are counted)."""
    out: Inventory = {}
    if not folder.is_dir():
        return out
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            if name.endswith(PARTIAL_SUFFIXES) or path.is_symlink():
                continue
            try:
                out[str(path.relative_to(folder))] = path.stat().st_size
            except OSError:
                continue
    # not model files: our markers, and huggingface_hub's record of files the repo lacks
    return {k: v for k, v in out.items() if not k.startswith((MARKER_DIR, ".no_exist"))}


def read_marker(cache: ModelCache, source: str, model: str, files: Inventory) -> bool:
    """True when a previous pod loaded this model completely from this cache and its files
    are all still there with the same sizes."""
    try:
        data = json.loads(marker_path(cache, source, model).read_text())
        recorded = {str(k): int(v) for k, v in dict(data["files"]).items()}
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(recorded) and all(files.get(k) == v for k, v in recorded.items())


def write_marker(cache: ModelCache, source: str, model: str, files: Inventory) -> Path:
    """Record that the model loaded completely from these files (the next pod runs offline).
    Written to a temporary name and renamed, so a reader never sees half of it."""
    path = marker_path(cache, source, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    body = {"model": model, "source": source, "time": round(time.time(), 3), "files": files}
    tmp.write_text(json.dumps(body, sort_keys=True))
    os.replace(tmp, path)
    return path


class CacheEscapeError(Exception):
    """A folder or file of the cache resolves outside the cache's root (a symbolic link planted
    in the cache leads out of it): the runtime refuses to start on it."""


def check_confined(
    source: str, model: str, cache: ModelCache, environ: Mapping[str, str]
) -> None:
    """Every folder the hub client and the runtime use in the cache — the hub cache, the
    model's folder and every link in it, the marker folder — resolves (realpath, links
    followed) inside the cache root ($MTP_RUNTIME_CACHE_ROOT, else the cache's path); raises
    CacheEscapeError naming the path, where it leads and the root otherwise."""
    root = environ.get(CACHE_ROOT_ENV) or cache.path
    real_root = os.path.realpath(root)
    hub = hub_cache_dir(source, cache, environ)
    folder = model_dir(source, model, hub)
    paths = [Path(cache.path), hub, folder, marker_path(cache, source, model).parent]
    if source != "modelscope":
        paths.append(Path(cache.path) / "huggingface" / "xet")
    for path in paths:
        _confined(path, real_root, root)
    if os.path.isdir(folder):  # the links in the model's folder (snapshots -> blobs)
        for top, dirs, files in os.walk(folder):
            for name in dirs + files:
                path = Path(top) / name
                if path.is_symlink():
                    _confined(path, real_root, root)


def _confined(path: Path, real_root: str, root: str) -> None:
    resolved = os.path.realpath(path)
    if inside(resolved, real_root):
        return
    shown = root if real_root == root else f"{root} (resolved: {real_root})"
    raise CacheEscapeError(
        f"model cache path {path} resolves to {resolved}, outside the cache root {shown} "
        f"(${CACHE_ROOT_ENV}): a symbolic link in the cache leads out of it; remove the link "
        "(the runtime does not use a cache that reaches other folders)"
    )


@dataclass(frozen=True)
class CachePlan:
    """What the runtime does about the cache for one start."""

    hub_dir: Path
    model_dir: Path
    env: dict[str, str]  # added to vLLM's environment
    offline: bool
    reason: str
    local: bool
    before: Inventory

    def to_dict(self, cache: ModelCache | None) -> dict[str, object]:
        files = self.before
        return {
            "cache": cache.kind if cache else "none",
            "path": cache.path if cache else None,
            "read_only": bool(cache and cache.read_only),
            "hub_cache": str(self.hub_dir),
            "offline": self.offline,
            "reason": self.reason,
            "files_before": len(files),
            "bytes_before": sum(files.values()),
        }


def plan_cache(
    source: str, model: str, cache: ModelCache | None, environ: Mapping[str, str],
    device: str = "",
) -> CachePlan:
    """The cache's environment for vLLM and the files present before it starts. Raises
    CacheEscapeError when the cache reaches outside its root (`check_confined`)."""
    local = is_local(model)
    if cache is not None:
        check_confined(source, model, cache, environ)
    hub = hub_cache_dir(source, cache, environ)
    folder = model_dir(source, model, hub)
    before = {} if local else inventory(folder)
    complete = cache is not None and read_marker(cache, source, model, before)
    offline, reason = offline_decision(local, cache, complete, bool(before))
    env = {**cache_env(source, cache, offline),
           **compile_cache_env(cache, environ, cache is not None and writable(cache.path),
                               device)}
    return CachePlan(hub, folder, env, offline, reason, local, before)


def writable(folder: str) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)

