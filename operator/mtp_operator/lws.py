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
  API, and LWS counts a group ready by its pods);
- restartPolicy RecreateGroupOnPodRestart: a pod that restarts takes its group with it (vLLM's
  process group cannot take a new member), so a rollback restarts whole groups;
- rolloutStrategy RollingUpdate, one group at a time, no surge (a group holds N nodes).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from mtp_operator.naming import GPU_RESOURCE

API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"
GROUP = "leaderworkerset.x-k8s.io"
PLURAL = "leaderworkersets"


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
    readyReplicas and updatedReplicas."""
    spec, st = body.get("spec") or {}, body.get("status") or {}
    desired = int(spec.get("replicas", 1))
    up_to_date = int(st.get("updatedReplicas", 0)) >= desired and int(
        st.get("replicas", 0)) <= desired
    return desired, int(st.get("readyReplicas", 0)), up_to_date
