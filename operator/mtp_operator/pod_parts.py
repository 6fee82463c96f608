"""Checks of the Kubernetes parts a spec passes through to the pods (env, resources,
tolerations). Pure.

The API server's schema refuses most of these already (crds/ carries the same rules as
structural schemas and CEL); these checks name the same problems for a resource the server
accepted anyway (an older CRD, `render`), with the user's own field path (`env[2].name`),
never the Deployment's, so a bad part is an InvalidSpec and never a failed apply.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from mtp_operator.api.v1alpha1 import (
    ENV_NAME,
    QUANTITY_PATTERN,
    RESERVED_ENV,
    TOLERATION_EFFECTS,
    TOLERATION_OPERATORS,
)
from mtp_operator.naming import GPU_RESOURCE
from mtp_runtime.model_cache import CACHE_ROOT_ENV
from mtp_runtime.pool_config import ENV_VAR

Problem = tuple[str, str]

# Kubernetes' resource.Quantity: a signed decimal number, then a binary-SI, decimal-SI or
# decimal-exponent suffix (k8s.io/apimachinery/pkg/api/resource/quantity.go).
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
_ENV_NAME_RE = re.compile(ENV_NAME)
ENV_KEYS = ("name", "value", "valueFrom")
VALUE_FROM_KEYS = ("configMapKeyRef", "secretKeyRef", "fieldRef", "resourceFieldRef")
TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
RESOURCES_KEYS = ("limits", "requests")


def is_quantity(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return value >= 0
    return isinstance(value, str) and bool(_QUANTITY_RE.match(value))


def _unknown(where: str, item: dict[str, Any], allowed: Iterable[str]) -> list[Problem]:
    allowed = tuple(allowed)
    return [
        (f"{where}.{k}", f"unknown field (allowed: {', '.join(allowed)})")
        for k in sorted(item)
        if k not in allowed
    ]


def env_problems(env: list[Any] | None) -> list[Problem]:
    found: list[Problem] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(env or []):
        where = f"env[{i}]"
        if not isinstance(item, dict):
            found.append((where, "must be an object with a name"))
            continue
        found += _unknown(where, item, ENV_KEYS)
        name = item.get("name")
        if not isinstance(name, str) or not name:
            found.append((f"{where}.name", "required: every env entry needs a name"))
            continue
        if not _ENV_NAME_RE.match(name):
            found.append((f"{where}.name", f"{name!r} is not a valid environment variable name"))
        if name == ENV_VAR:
            found.append((f"{where}.name", f"{name} is set by the operator (the pool's config)"))
        elif name == CACHE_ROOT_ENV:
            found.append((f"{where}.name", f"{name} is set by the operator (the model cache's "
                          "root, which the runtime keeps the cache inside)"))
        elif name in RESERVED_ENV:
            found.append((f"{where}.name", f"{name} is set by the operator from modelSource; "
                          "use modelSource instead"))
        if name in seen:
            found.append((f"{where}.name", f"duplicate name {name} (also env[{seen[name]}])"))
        seen.setdefault(name, i)
        if "value" in item and not isinstance(item["value"], str):
            found.append((f"{where}.value", "must be a string"))
        if "value" in item and "valueFrom" in item:
            found.append((where, "value and valueFrom are exclusive"))
        vf = item.get("valueFrom")
        if vf is not None:
            if not isinstance(vf, dict) or len(vf) != 1 or next(iter(vf)) not in VALUE_FROM_KEYS:
                found.append((f"{where}.valueFrom", f"must set exactly one of "
                              f"{', '.join(VALUE_FROM_KEYS)}"))
    return found


def resources_problems(resources: dict[str, Any] | None) -> list[Problem]:
    found: list[Problem] = []
    if not resources:
        return found
    found += _unknown("resources", resources, (*RESOURCES_KEYS, "claims"))
    for part in RESOURCES_KEYS:
        values = resources.get(part)
        if values is None:
            continue
        if not isinstance(values, dict):
            found.append((f"resources.{part}", "must be a map of resource name to quantity"))
            continue
        for name, value in sorted(values.items()):
            if name == GPU_RESOURCE:
                continue  # set from tensorParallelSize
            if not is_quantity(value):
                found.append((f"resources.{part}[{name}]",
                              f"{value!r} is not a quantity (e.g. 500m, 64Gi, 2)"))
    return found


def tolerations_problems(tolerations: list[Any] | None) -> list[Problem]:
    found: list[Problem] = []
    for i, item in enumerate(tolerations or []):
        where = f"tolerations[{i}]"
        if not isinstance(item, dict):
            found.append((where, "must be an object (key, operator, value, effect)"))
            continue
        found += _unknown(where, item, TOLERATION_KEYS)
        op = item.get("operator", "Equal")
        if op not in TOLERATION_OPERATORS:
            found.append((f"{where}.operator", f"{op!r}: must be Exists or Equal"))
        if op == "Exists" and item.get("value"):
            found.append((f"{where}.value", "must be empty when operator is Exists"))
        if not item.get("key") and op != "Exists":
            found.append((f"{where}.key", "required unless operator is Exists"))
        effect = item.get("effect")
        if effect not in (None, "", *TOLERATION_EFFECTS):
            found.append((f"{where}.effect", f"{effect!r}: must be one of "
                          f"{', '.join(TOLERATION_EFFECTS)} (or empty for all)"))
        for key in ("key", "value"):
            if key in item and not isinstance(item[key], str):
                found.append((f"{where}.{key}", "must be a string"))
        seconds = item.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            found.append((f"{where}.tolerationSeconds", "must be an integer"))
        elif seconds is not None and effect != "NoExecute":
            found.append((f"{where}.tolerationSeconds", "only valid with effect NoExecute"))
    return found


def pod_part_problems(
    env: list[Any] | None, resources: dict[str, Any] | None, tolerations: list[Any] | None
) -> list[Problem]:
    return env_problems(env) + resources_problems(resources) + tolerations_problems(tolerations)
