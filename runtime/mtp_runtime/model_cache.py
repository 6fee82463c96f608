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
download (their bytes are reported); none, a start from the cache. This module is the pure
part (paths, variables, decisions); `cache_files` reads and writes the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CacheKind = Literal["persistentVolumeClaim", "hostPath"]
# The folder the cache volume is mounted at, as the operator set it (a hostPath pool's pods):
# every folder the runtime uses must resolve inside it (`cache_files.check_confined`). Unset,
# the cache's own path is the root.
CACHE_ROOT_ENV = "MTP_RUNTIME_CACHE_ROOT"
Origin = Literal["cache", "download", "local"]
MARKER_DIR = ".mtp-runtime"
PARTIAL_SUFFIXES = (".incomplete", ".lock", ".tmp")  # files the hub client has not finished


@dataclass(frozen=True)
class ModelCache:
    """The cache volume as the pod sees it."""

    path: str  # where the volume is mounted in the pod
    kind: CacheKind
    read_only: bool = False


def inside(resolved: str, root: str) -> bool:
    """`resolved` is `root` or below it (both already resolved, absolute)."""
    return resolved == root or resolved.startswith(root.rstrip("/") + "/")


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
    xdg = Path(environ.get("XDG_CACHE_HOME") or _home(environ) / ".cache")
    return Path(environ.get("HF_HOME") or xdg / "huggingface") / "hub"


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("HOME") or Path.home())


def model_dir(source: str, model: str, hub_dir: Path) -> Path:
    """The model's own folder in the hub cache (modelscope: the whole cache, whose layout
    changes between client versions)."""
    if source == "modelscope":
        return hub_dir
    return hub_dir / ("models--" + model.replace("/", "--"))


Inventory = dict[str, int]  # relative path -> size, of complete regular files


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


def _file_name(text: str) -> str:
    """`text` as one safe file name: anything but letters, digits and -_. becomes -."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def marker_path(cache: ModelCache, source: str, model: str) -> Path:
    name = _file_name(model.replace("/", "--"))
    return Path(cache.path) / MARKER_DIR / "complete" / source / f"{name}.json"


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


# Where compiled kernels go in a writable cache volume (variable: folder below
# <cache>/compile/<product>): vLLM's torch.compile artefacts and Triton's kernels. Each change
# of K starts new pods; without this each compiles again.
COMPILE_DIR = "compile"
COMPILE_ENV = {"VLLM_CACHE_ROOT": "vllm", "TRITON_CACHE_DIR": "triton"}


def compile_cache_env(
    cache: ModelCache | None, environ: Mapping[str, str], writable: bool, device: str = ""
) -> dict[str, str]:
    """The variables that keep vLLM's and Triton's compiled kernels in the cache volume, so a
    pod that starts after another (a change of K, a rollout) loads what that one compiled
    instead of compiling again: the 27B-class hybrid started in 78-80 s with the folder an
    earlier start left, 224-238 s with an empty one (H100 80GB HBM3,
    bench/results/gpu/README.md). Nothing without a cache, with a read-only one, or with one
    this user cannot write (the kernels then stay in the container, as before); a variable
    the pod sets itself is kept. One folder per `device` (the GPU product the pod got): a
    claim shared by pools on different GPUs keeps each product's kernels apart. Both writers
    store by content key and replace files atomically (torch >= 2.10), so pods sharing the
    folder do not corrupt it."""
    if cache is None or cache.read_only or not writable:
        return {}
    base = Path(cache.path) / COMPILE_DIR / (_file_name(device) or "any")
    return {name: str(base / folder) for name, folder in COMPILE_ENV.items()
            if not environ.get(name)}


def offline_decision(
    local: bool, cache: ModelCache | None, complete: bool, has_files: bool
) -> tuple[bool, str]:
    """Whether vLLM may run with HF_HUB_OFFLINE=1, and why: only when the whole model is known
    to be in the cache (`complete`: a previous pod's marker still matches the files)."""
    if local:
        return False, "the model is a path: no hub involved"
    if cache is None:
        return False, "no cache volume: the pod's own file system"
    if cache.read_only:
        return True, "read-only cache: the hub is not asked (it cannot be written)"
    if complete:
        return True, "a previous pod loaded this model completely from the cache"
    if has_files:
        return False, "files in the cache, not known to be complete: the hub client checks them"
    return False, "not in the cache yet: the hub client downloads it"
