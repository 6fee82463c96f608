"""Does an observed pool Deployment still carry the operator's settings? Pure.

Fields the operator writes are compared in the form the API server keeps, so the server's
defaulting never looks like a change (that would be a hot loop), while a hand edit of what
matters (replicas, image, command, env, the runtime config, GPUs, placement) is noticed. A
field someone *added* to the Deployment's spec or pod template (args, env entries, volumes,
containers, ...) is drift too (`added_fields`); a field found with exactly the value the API
server defaults it to is not. Labels and annotations other tools add (Argo CD's tracking id,
`kubectl rollout restart`'s restartedAt) are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtp_operator.lws import as_deployment_shape, group_size, is_leaderworkerset, worker_template
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


# The only metadata annotations drift compares (the rest of metadata is not read): a
# controller's own annotation (the Deployment's revision) leaves the drift result as it was.
DRIFT_ANNOTATIONS = (ANNOTATION_SETTINGS_HASH, ANNOTATION_COMMAND)


def annotations_read(
    deploy: Mapping[str, Any], keys: tuple[str, ...] = DRIFT_ANNOTATIONS
) -> tuple[str | None, ...]:
    """The values of the annotations `keys` of `deploy` (None where absent), in order."""
    annotations = _get(deploy, "metadata", "annotations") or {}
    return tuple(annotations.get(k) for k in keys)


def _view(pool: Mapping[str, Any]) -> dict[str, Any]:
    deploy = as_deployment_shape(pool)  # a LeaderWorkerSet: its groups and leader template
    container = _get(deploy, "spec", "template", "spec", "containers", 0)
    settings_hash, command = annotations_read(deploy)
    worker = worker_template(pool)
    return {
        # a pool that becomes (or stops being) a LeaderWorkerSet is written as the new kind
        # and the old object deleted, as for a new name
        "pool kind": "LeaderWorkerSet" if is_leaderworkerset(pool) else "Deployment",
        "group size": group_size(pool),
        "worker pod template settings-hash": _get(
            worker, "metadata", "annotations", ANNOTATION_SETTINGS_HASH),
        "worker command": _get(worker, "spec", "containers", 0, "command"),
        # a pool whose name changed (an upgrade that names it otherwise) is written under
        # its new name, and the old Deployment deleted (control/pool_writes.py, issue 36)
        "name": _get(deploy, "metadata", "name"),
        "settings-hash annotation": settings_hash,
        "vllm-command annotation": command,
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
    desired, observed = as_deployment_shape(desired), as_deployment_shape(observed)
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


_ANY = object()
# What the API server fills in (k8s.io/kubernetes/pkg/apis/*/v1/defaults.go): found with
# these values, a field the operator does not write is the server's, not a hand edit.
_DEPLOYMENT_DEFAULTS: dict[str, Any] = {"progressDeadlineSeconds": 600, "revisionHistoryLimit": 10}
_POD_DEFAULTS: dict[str, Any] = {
    "dnsPolicy": "ClusterFirst",
    "restartPolicy": "Always",
    "schedulerName": "default-scheduler",
    "securityContext": {},
    "terminationGracePeriodSeconds": 30,
}
_CONTAINER_DEFAULTS: dict[str, Any] = {
    "terminationMessagePath": "/dev/termination-log",
    "terminationMessagePolicy": "File",
    "imagePullPolicy": _ANY,  # Always or IfNotPresent, by the image tag
    "resources": {},
}


def _extra_keys(
    want: Mapping[str, Any] | None, have: Mapping[str, Any] | None, defaults: Mapping[str, Any]
) -> list[str]:
    """Keys of `have` that `want` lacks, unless they hold the server's default."""
    want, have = want or {}, have or {}
    out = []
    for key in sorted(set(have) - set(want)):
        default = defaults.get(key, None)
        if key in defaults and (default is _ANY or have[key] == default):
            continue
        if have[key] in (None, [], {}):
            continue  # an empty field is no setting
        out.append(key)
    return out


def _names(items: Any, key: str = "name") -> list[str]:
    return [str(i.get(key)) for i in items or [] if isinstance(i, Mapping)]


def added_fields(desired: Mapping[str, Any], observed: Mapping[str, Any]) -> list[str]:
    """Fields someone added to the pool's spec or pod template that the operator never sets,
    as `added <path>` entries; empty when nothing was added. Of a LeaderWorkerSet, the
    leader's pod template (its spec is the LWS webhook's to default)."""
    out = []
    if not is_leaderworkerset(desired):
        out += [f"spec.{k}" for k in _extra_keys(desired.get("spec"), observed.get("spec"),
                                                 _DEPLOYMENT_DEFAULTS)]
    desired, observed = as_deployment_shape(desired), as_deployment_shape(observed)
    want_pod = _get(desired, "spec", "template", "spec") or {}
    have_pod = _get(observed, "spec", "template", "spec") or {}
    listed = ("containers", "initContainers", "ephemeralContainers", "volumes")  # by name below
    out += [
        f"pod {k}" for k in _extra_keys(want_pod, have_pod, _POD_DEFAULTS) if k not in listed
    ]
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        extra = set(_names(have_pod.get(kind))) - set(_names(want_pod.get(kind)))
        out += [f"{kind}[{n}]" for n in sorted(extra)]
    extra = set(_names(have_pod.get("volumes"))) - set(_names(want_pod.get("volumes")))
    out += [f"volumes[{n}]" for n in sorted(extra)]
    wanted = {c.get("name"): c for c in want_pod.get("containers") or []}
    for have in have_pod.get("containers") or []:
        want = wanted.get(have.get("name"))
        if want is None:
            continue
        name = have.get("name")
        out += [f"container {name} {k}" for k in _extra_keys(want, have, _CONTAINER_DEFAULTS)]
        for field, key in (("env", "name"), ("volumeMounts", "mountPath"), ("ports", "name")):
            extra = set(_names(have.get(field), key)) - set(_names(want.get(field), key))
            out += [f"container {name} {field}[{n}]" for n in sorted(extra)]
        for part in ("limits", "requests"):
            extra = set(_get(have, "resources", part) or {}) - set(
                _get(want, "resources", part) or {}
            )
            out += [f"container {name} resources.{part}[{n}]" for n in sorted(extra)]
    return [f"added {path}" for path in out]


def drifted_fields(desired: Mapping[str, Any], observed: Mapping[str, Any]) -> list[str]:
    """Names of the operator-owned fields that differ, then the fields someone added (see
    `added_fields`); empty when the pool is as desired."""
    want, have = _view(desired), _view(observed)
    changed = [field for field, value in want.items() if have[field] != value]
    if _env_drifted(desired, observed):
        changed.append("env")
    return changed + added_fields(desired, observed)
