"""The model cache: where the hub client keeps the weights, and whether they came from there.

Shared and standard library only. The operator mounts the pool's cache volume (a
PersistentVolumeClaim or a node folder) at one fixed path and says so in the pool
configuration (`PoolConfig.model_cache`); the runtime points vLLM's hub client there:

- `huggingface`: `HF_HUB_CACHE=<path>/huggingface/hub` (and `HF_XET_CACHE` beside it), the
  layout `models--<org>--<name>/{blobs,snapshots,refs}` that huggingface_hub writes;
- `modelscope`: `MODELSCOPE_CACHE=<path>/modelscope`.

A restarted pod (a change of K, a rollback) then finds the weights. When the runtime knows the
cache holds the whole model — a read-only cache (a separate job filled it), or a writable one
where a previous pod of this model loaded it completely and left a marker — vLLM runs with
`HF_HUB_OFFLINE=1`: the start makes no request to the hub at all.

Whether the weights were downloaded is decided from the files, not from what the client
logs: the model's files in the cache before vLLM starts and once it is Ready. New files mean a
download (their bytes are reported); none, a start from the cache.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

CacheKind = Literal["persistentVolumeClaim", "hostPath"]
Origin = Literal["cache", "download", "local"]
MARKER_DIR = ".mtp-runtime"
_PARTIAL_SUFFIXES = (".incomplete", ".lock", ".tmp")


@dataclass(frozen=True)
class ModelCache:
    """The cache volume as the pod sees it."""

    path: str  # where the volume is mounted in the pod
    kind: CacheKind
    read_only: bool = False


def hub_cache_dir(source: str, cache: ModelCache | None, environ: Mapping[str, str]) -> Path:
    """The folder the hub client stores models in: the cache's, or the client's default
    (what a pod without a cache uses, in its own container file system)."""
    if source == "modelscope":
        if cache is not None:
            return Path(cache.path) / "modelscope"
        return Path(environ.get("MODELSCOPE_CACHE") or _home(environ) / ".cache/modelscope/hub")
    if cache is not None:
        return Path(cache.path) / "huggingface" / "hub"
    # huggingface_hub.constants: HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else HF_HOME/hub
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if environ.get(name):
            return Path(environ[name])
    xdg = environ.get("XDG_CACHE_HOME") or str(_home(environ) / ".cache")
    return Path(environ.get("HF_HOME") or os.path.join(xdg, "huggingface")) / "hub"


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("HOME") or Path.home())


def model_dir(source: str, model: str, hub_dir: Path) -> Path:
    """The model's own folder in the hub cache (modelscope: the whole cache, whose layout
    changes between client versions)."""
    if source == "modelscope":
        return hub_dir
    return hub_dir / ("models--" + model.replace("/", "--"))


def is_local(model: str) -> bool:
    """A path (vLLM loads it as is), not a hub id."""
    return model.startswith(("/", "./", "../")) or Path(model).is_dir()


Inventory = dict[str, int]  # relative path -> size, of complete regular files


def inventory(folder: Path) -> Inventory:
    """Complete files under `folder` (symlinks are followed only to count them once:
    huggingface_hub's snapshots link to blobs, which are counted)."""
    out: Inventory = {}
    if not folder.is_dir():
        return out
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            if name.endswith(_PARTIAL_SUFFIXES) or path.is_symlink():
                continue
            try:
                out[str(path.relative_to(folder))] = path.stat().st_size
            except OSError:
                continue
    # not model files: our markers, and huggingface_hub's record of files the repo lacks
    return {k: v for k, v in out.items() if not k.startswith((MARKER_DIR, ".no_exist"))}


@dataclass(frozen=True)
class LoadReport:
    origin: Origin
    downloaded_files: int
    downloaded_bytes: int
    cached_files: int
    cached_bytes: int

    def to_dict(self) -> dict[str, object]:
        return {
            "origin": self.origin,
            "downloaded_files": self.downloaded_files,
            "downloaded_bytes": self.downloaded_bytes,
            "cached_files": self.cached_files,
            "cached_bytes": self.cached_bytes,
        }


def compare(before: Inventory, after: Inventory, local: bool = False) -> LoadReport:
    """Where the weights came from: files new (or changed) since vLLM started were
    downloaded; the others were already there."""
    new = {k: v for k, v in after.items() if before.get(k) != v}
    kept = {k: v for k, v in after.items() if k not in new}
    origin: Origin = "local" if local else ("download" if new else "cache")
    return LoadReport(origin, len(new), sum(new.values()), len(kept), sum(kept.values()))


def marker_path(cache: ModelCache, source: str, model: str) -> Path:
    return Path(cache.path) / MARKER_DIR / "complete" / source / (quote(model, safe="") + ".json")


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


def cache_env(source: str, cache: ModelCache | None, offline: bool) -> dict[str, str]:
    """The variables that point the hub client at the cache (empty without a cache)."""
    if cache is None:
        return {}
    if source == "modelscope":
        env = {"MODELSCOPE_CACHE": str(Path(cache.path) / "modelscope")}
    else:
        base = Path(cache.path) / "huggingface"
        env = {"HF_HUB_CACHE": str(base / "hub"), "HF_XET_CACHE": str(base / "xet")}
    if offline:
        env["HF_HUB_OFFLINE"] = "1"  # vLLM hands the same switch to ModelScope's client
    return env


def plan_cache(
    source: str, model: str, cache: ModelCache | None, environ: Mapping[str, str]
) -> CachePlan:
    """The cache's environment for vLLM and the files present before it starts."""
    local = is_local(model)
    hub = hub_cache_dir(source, cache, environ)
    folder = model_dir(source, model, hub)
    before = {} if local else inventory(folder)
    if local:
        offline, reason = False, "the model is a path: no hub involved"
    elif cache is None:
        offline, reason = False, "no cache volume: the pod's own file system"
    elif cache.read_only:
        offline, reason = True, "read-only cache: the hub is not asked (it cannot be written)"
    elif read_marker(cache, source, model, before):
        offline, reason = True, "a previous pod loaded this model completely from the cache"
    elif before:
        offline, reason = False, "files in the cache, not known to be complete: the hub "\
            "client checks them"
    else:
        offline, reason = False, "not in the cache yet: the hub client downloads it"
    return CachePlan(hub, folder, cache_env(source, cache, offline), offline, reason, local,
                     before)


def writable(folder: str) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)
