"""A multi-node pool as a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1). Pure.

When spec.fit puts a replica on N nodes (planning.PoolPlan.nodes > 1), the pool is one
LeaderWorkerSet instead of a Deployment: `replicas` groups of `size` N pods, one per node, each
pod taking a whole node's GPUs. Every pod runs the pool's own command and MTP_RUNTIME_CONFIG;
the runtime adds its rank and the leader's address from the LWS environment
(mtp_runtime.multinode). It is built from the pool's Deployment (builders.pool_deployment), so
names, labels, annotations (command, settings hash, product), owner reference and the pod
template are the same; the field names follow sigs.k8s.io/lws v0.7.0 api/leaderworkerset/v1.

- leaderTemplate: the pod template as it is (the leader serves the API, its readiness is the
  pool's); workerTemplate: the same without a readiness probe (a headless worker serves no
  API, and LWS counts a group ready by its pods) and without the labels the resource's
  Services, the InferencePool and the operator's pod index select pool pods by (resource,
  GPU product, class): a worker takes no requests and exports no vLLM metrics; it carries
  `mtp-operator.io/group-role: worker` instead;
- restartPolicy RecreateGroupOnPodRestart: a pod that restarts takes its group with it (vLLM's
  process group cannot take a new member), so a rollback restarts whole groups;
- rolloutStrategy RollingUpdate, one group at a time, no surge (a group holds N nodes).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from mtp_operator.naming import (
    GPU_RESOURCE,
    LABEL_GPU_PRODUCT,
    LABEL_RESOURCE,
    LABEL_TRAFFIC_CLASS,
)

API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"
GROUP = "leaderworkerset.x-k8s.io"
PLURAL = "leaderworkersets"
LABEL_GROUP_ROLE = "mtp-operator.io/group-role"
# what selects a pool's serving pods: a worker pod carries none of these
SERVING_LABELS = (LABEL_RESOURCE, LABEL_GPU_PRODUCT, LABEL_TRAFFIC_CLASS)


def _with_gpus(pod_spec: dict[str, Any], gpus: int) -> None:
    for container in pod_spec.get("containers") or []:
        resources = container.setdefault("resources", {})
        resources["limits"] = {**(resources.get("limits") or {}), GPU_RESOURCE: str(gpus)}
        if GPU_RESOURCE in (resources.get("requests") or {}):
            resources["requests"][GPU_RESOURCE] = str(gpus)


def pool_leaderworkerset(
    deployment: Mapping[str, Any], nodes: int, gpus_per_pod: int
) -> dict[str, Any]:
    """The LeaderWorkerSet of a pool whose replica spans `nodes` pods of `gpus_per_pod` GPUs,
    from the pool's Deployment."""
    if nodes < 2:
        raise ValueError(f"a LeaderWorkerSet pool spans 2 or more nodes, not {nodes}")
    d = copy.deepcopy(dict(deployment))
    leader = d["spec"]["template"]
    _with_gpus(leader["spec"], gpus_per_pod)
    worker = copy.deepcopy(leader)
    for container in worker["spec"].get("containers") or []:
        container.pop("readinessProbe", None)
    labels = {k: v for k, v in (worker.get("metadata") or {}).get("labels", {}).items()
              if k not in SERVING_LABELS}
    worker.setdefault("metadata", {})["labels"] = {**labels, LABEL_GROUP_ROLE: "worker"}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": d["metadata"],
        "spec": {
            "replicas": d["spec"]["replicas"],
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def observe_leaderworkerset(body: Mapping[str, Any]) -> tuple[int, int, bool]:
    """(desired groups, ready groups, up to date) of a pool LeaderWorkerSet, as
    status.observe_deployment reads a Deployment: LWS counts groups in replicas,
    readyReplicas and updatedReplicas (a group is ready when all its pods are)."""
    spec, st = body.get("spec") or {}, body.get("status") or {}
    desired = int(spec.get("replicas", 1))
    # LWS keeps no observedGeneration: its conditions say a rolling update is under way
    rolling = any(
        c.get("type") in ("Progressing", "UpdateInProgress") and c.get("status") == "True"
        for c in st.get("conditions") or []
    )
    up_to_date = not rolling and int(st.get("updatedReplicas", 0)) >= desired and int(
        st.get("replicas", 0)) <= desired
    return desired, int(st.get("readyReplicas", 0)), up_to_date


def is_leaderworkerset(body: Mapping[str, Any]) -> bool:
    """Whether a pool object is a LeaderWorkerSet (by its spec: a watched object's kind is
    not always filled in)."""
    return "leaderWorkerTemplate" in (body.get("spec") or {})


def group_size(body: Mapping[str, Any]) -> int:
    """Pods per group of a pool LeaderWorkerSet (1 for a Deployment)."""
    if not is_leaderworkerset(body):
        return 1
    return int(body["spec"]["leaderWorkerTemplate"].get("size") or 1)


def as_deployment_shape(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """A pool object as the Deployment readers (drift, rollout's GPU count) read one: a
    LeaderWorkerSet's metadata, its groups as `replicas` and its leader's pod template as
    `template`; a Deployment as it is."""
    if not is_leaderworkerset(body):
        return body
    spec = body["spec"]
    return {
        "metadata": body.get("metadata") or {},
        "spec": {
            "replicas": spec.get("replicas"),
            "template": spec["leaderWorkerTemplate"].get("leaderTemplate") or {},
        },
    }


def worker_template(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A pool LeaderWorkerSet's worker pod template (None for a Deployment)."""
    if not is_leaderworkerset(body):
        return None
    return body["spec"]["leaderWorkerTemplate"].get("workerTemplate")


def pods_shape(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """`as_deployment_shape` with every pod as a replica (groups x pods per group): what a
    pool asks of its GPU product (rollout.requested_gpus reads it)."""
    if not is_leaderworkerset(body):
        return body
    shape = as_deployment_shape(body)
    groups = shape["spec"].get("replicas")
    groups = groups if isinstance(groups, int) else 1
    return {**shape, "spec": {**shape["spec"], "replicas": groups * group_size(body)}}
