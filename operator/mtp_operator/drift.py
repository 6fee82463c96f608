"""Does an observed pool Deployment still carry the operator's settings? Pure.

Only fields the operator writes in the form the API server keeps are compared, so the
server's defaulting never looks like a change (that would be a hot loop), while a hand edit of
what matters (replicas, image, command, env, the runtime config, GPUs, placement) is noticed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtp_operator.naming import ANNOTATION_COMMAND, ANNOTATION_SETTINGS_HASH, GPU_RESOURCE
from mtp_runtime.pool_config import ENV_VAR


def _get(obj: Mapping[str, Any] | None, *path: str | int) -> Any:
    cur: Any = obj
    for key in path:
        if isinstance(key, int):
            cur = cur[key] if isinstance(cur, list) and len(cur) > key else None
        else:
            cur = cur.get(key) if isinstance(cur, Mapping) else None
        if cur is None:
            return None
    return cur


def _env_value(container: Mapping[str, Any] | None, name: str) -> str | None:
    for entry in (container or {}).get("env") or []:
        if entry.get("name") == name:
            return entry.get("value")
    return None


def _view(deploy: Mapping[str, Any]) -> dict[str, Any]:
    container = _get(deploy, "spec", "template", "spec", "containers", 0)
    return {
        "settings-hash annotation": _get(
            deploy, "metadata", "annotations", ANNOTATION_SETTINGS_HASH
        ),
        "vllm-command annotation": _get(deploy, "metadata", "annotations", ANNOTATION_COMMAND),
        "replicas": _get(deploy, "spec", "replicas"),
        "pod template settings-hash": _get(
            deploy, "spec", "template", "metadata", "annotations", ANNOTATION_SETTINGS_HASH
        ),
        "image": _get(container, "image"),
        "command": _get(container, "command"),
        "runtime config": _env_value(container, ENV_VAR),
        "GPU limit": str(_get(container, "resources", "limits", GPU_RESOURCE)),
        "node affinity": _get(deploy, "spec", "template", "spec", "affinity"),
    }


def _env_drifted(desired: Mapping[str, Any], observed: Mapping[str, Any]) -> bool:
    """An env entry the operator sets is missing or has another value (the runtime config is
    compared on its own). Values compare as the API server keeps them (an empty value is
    dropped); `valueFrom` entries only by presence, as the server fills in their defaults.
    Entries someone else added are not ours to judge."""
    path = ("spec", "template", "spec", "containers", 0, "env")
    have = {e.get("name"): e for e in _get(observed, *path) or []}
    for entry in _get(desired, *path) or []:
        name = entry.get("name")
        if name == ENV_VAR:
            continue
        got = have.get(name)
        if got is None:
            return True
        if "valueFrom" in entry:
            if "valueFrom" not in got:
                return True
        elif (got.get("value") or "") != (entry.get("value") or "") or "valueFrom" in got:
            return True
    return False


def drifted_fields(desired: Mapping[str, Any], observed: Mapping[str, Any]) -> list[str]:
    """Names of the operator-owned fields that differ; empty when the pool is as desired."""
    want, have = _view(desired), _view(observed)
    changed = [field for field, value in want.items() if have[field] != value]
    if _env_drifted(desired, observed):
        changed.append("env")
    return changed
