"""A benchmark script's module, loaded by its path (bench/'s folders are not packages, and
`k-change` is no module name), so tests and other scripts need no `sys.path` edit for it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load(relative: str, name: str | None = None) -> ModuleType:
    """The module of REPO/relative (e.g. "bench/tuning/tuning_pooled.py"), loaded once and
    kept in sys.modules under `name` (the file's stem unless given)."""
    path = REPO / relative
    name = name or path.stem
    module = sys.modules.get(name)
    if module is not None and Path(getattr(module, "__file__", "") or "").resolve() == path:
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
