"""Desired Kubernetes objects for a resource, as plain dicts. Pure: same input, same output.

The pool Deployment's pod template only changes when the pool's settings change, and its
`mtp-operator.io/settings-hash` says so, so unchanged pools are never rolled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mtp_operator.api.classes import context_length_range
from mtp_operator.api.v1alpha1 import (
    GROUP,
    KIND,
    MODEL_CACHE_MOUNT_PATH,
    VERSION,
    MTPInferenceSpec,
)
from mtp_operator.lws import pool_leaderworkerset
from mtp_operator.model_cache import EffectiveCache, volume, volume_mount
from mtp_operator.naming import (
    ANNOTATION_COMMAND,
    ANNOTATION_GPU_PRODUCT,
    ANNOTATION_SETTINGS_HASH,
    ANNOTATION_TRAFFIC_CLASS,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    LABEL_CANARY,
    LABEL_OWNER_UID,
    LABEL_RESOURCE,
    canary_pod_name,
    label_value,
    pool_deployment_name,
    pool_labels,
    pool_selector,
    resource_labels,
    service_name,
    short_hash,
)
from mtp_operator.planning import PoolPlan
from mtp_operator.rollout import NO_SURGE, min_available
from mtp_operator.routing import routing_objects
from mtp_runtime.drain import DRAIN_SECONDS_ENV, STOP_MARGIN_S
from mtp_runtime.gpu_profiles import entries_for
from mtp_runtime.model_cache import CACHE_ROOT_ENV
from mtp_runtime.pool_config import ENV_VAR, PoolConfig
from mtp_runtime.vllm_command import DEFAULT_PORT, EXPORTER_PORT, build_argv, build_env

# The engine's start-up allowance (startupProbe): loading a large model takes many minutes.
# Tuning waits as long for a trial's pods (tuning.settings).
STARTUP_PROBE_PERIOD_S = 10
STARTUP_PROBE_FAILURES = 180
STARTUP_BUDGET_S = STARTUP_PROBE_PERIOD_S * STARTUP_PROBE_FAILURES

METRICS_PORT = EXPORTER_PORT  # the exporter's port: its home is mtp_runtime.vllm_command
# Readiness is the runtime's /ready (vLLM's /health while not draining): it turns false when a
# leaving pod's drain begins, while vLLM still serves the requests it holds (issue 37).
READINESS_PATH = "/ready"
READINESS_PERIOD_S = 2
READINESS_FAILURES = 2
FIELD_MANAGER = "mtp-operator"


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _pool_labels(name: str, spec: MTPInferenceSpec, plan: PoolPlan) -> dict[str, str]:
    """A pool's labels; a class pool's also name its class and, for a prompt-length class,
    its range (`llm-d.ai/context-length-range`, read by llm-d's context-length scorer)."""
    if plan.traffic_class is None:
        return pool_labels(name, plan.gpu_product)
    cls = next((c for c in spec.speculative.classes or () if c.name == plan.traffic_class), None)
    length_range = context_length_range(cls) if cls is not None else None
    return pool_labels(name, plan.gpu_product, plan.traffic_class, length_range)


def _class_annotation(plan: PoolPlan) -> dict[str, str]:
    return {} if plan.traffic_class is None else {ANNOTATION_TRAFFIC_CLASS: plan.traffic_class}


def pool_config(
    spec: MTPInferenceSpec,
    plan: PoolPlan,
    cluster_profiles: Mapping[str, int],
    model_cache: EffectiveCache | None = None,
) -> PoolConfig:
    return PoolConfig(
        serve=plan.serve,
        gpu_product=plan.gpu_product,
        k_mode=plan.k_mode,  # type: ignore[arg-type]
        # only this product's entries: editing another GPU's entry must not roll this pool
        profiles=entries_for(spec.speculative.profiles, plan.gpu_product),
        cluster_overrides=entries_for(cluster_profiles, plan.gpu_product),
        max_speculative_tokens=spec.speculative.max_speculative_tokens,
        model_cache=model_cache.runtime if model_cache else None,
    )


def _resources(spec: MTPInferenceSpec) -> dict[str, Any]:
    resources = json.loads(json.dumps(spec.resources or {}))
    gpus = str(spec.tensor_parallel_size)
    resources["limits"] = {**(resources.get("limits") or {}), GPU_RESOURCE: gpus}
    if GPU_RESOURCE in (resources.get("requests") or {}):
        resources["requests"][GPU_RESOURCE] = gpus
    return resources


def _pod_spec(
    spec: MTPInferenceSpec,
    plan: PoolPlan,
    config: PoolConfig,
    image: str,
    model_cache: EffectiveCache | None = None,
) -> dict:
    env = [{"name": ENV_VAR, "value": config.to_json()}]
    env += [{"name": k, "value": v} for k, v in sorted(build_env(plan.serve).items())]
    env.append({"name": DRAIN_SECONDS_ENV, "value": str(spec.rollout.drain_seconds)})
    if model_cache is not None and model_cache.spec.host_path is not None:
        # the runtime refuses a cache folder a symbolic link leads out of this root
        env.append({"name": CACHE_ROOT_ENV, "value": MODEL_CACHE_MOUNT_PATH})
    env += list(spec.env or [])
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": GPU_PRODUCT_LABEL,
                                "operator": "In",
                                "values": [plan.gpu_product],
                            }
                        ]
                    }
                ]
            }
        }
    }
    # GPU nodes are commonly tainted nvidia.com/gpu:NoSchedule; these pods are what they're for.
    tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    tolerations += list(spec.tolerations or [])
    container = {
        "name": "vllm",
        "image": image,
        "command": ["mtp-runtime", "serve"],
        "env": env,
        "ports": [
            {"name": "http", "containerPort": DEFAULT_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": _resources(spec),
        # Loading a large model takes many minutes; vLLM refuses connections until then.
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": STARTUP_PROBE_PERIOD_S,
            "failureThreshold": STARTUP_PROBE_FAILURES,
        },
        "readinessProbe": {
            "httpGet": {"path": READINESS_PATH, "port": "metrics"},
            "periodSeconds": READINESS_PERIOD_S,
            "failureThreshold": READINESS_FAILURES,
            "timeoutSeconds": 3,  # /ready asks vLLM's /health with a 2 s timeout
        },
        # A leaving pod drains first (mtp_runtime.drain): readiness false, then the requests
        # it holds finish (or spec.rollout.drainSeconds pass); only then does vLLM stop.
        "lifecycle": {"preStop": {"exec": {"command": ["mtp-runtime", "drain"]}}},
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 15,
            "failureThreshold": 4,
        },
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    pod: dict[str, Any] = {
        # No service links: a Service named like `vllm` would inject VLLM_PORT=tcp://...
        "enableServiceLinks": False,
        "affinity": affinity,
        "tolerations": tolerations,
        # the drain, then vLLM's own --shutdown-timeout and its teardown
        "terminationGracePeriodSeconds": spec.rollout.drain_seconds + STOP_MARGIN_S,
        "containers": [container],
        # tensor-parallel workers exchange tensors through shared memory
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if model_cache is not None:  # the weights outlive the pod (mtp_operator.model_cache)
        container["volumeMounts"].append(volume_mount(model_cache))
        pod["volumes"].append(volume(model_cache))
    if spec.host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    return pod


def settings_hash(pod_spec: Mapping[str, Any], replicas: int | None = None) -> str:
    """The pool's settings digest. With `replicas` (the Deployment's annotation and
    status.pools[].settingsHash) a scale is a settings change; without it (the pod template's
    annotation) only the pod spec counts, so scaling a pool never restarts its pods."""
    return _settings_digest(json.dumps(pod_spec, sort_keys=True), replicas)


def _settings_digest(pod_json: str, replicas: int | None) -> str:
    """The digest of json.dumps({"pod": pod spec[, "replicas": n]}, sort_keys=True) from the
    pod spec's own sorted JSON (the same text: "pod" sorts before "replicas"). A pool needs
    the digest with and without replicas, and encoding its pod spec twice was most of the
    JSON encoding of a restart (7% of the operator's CPU)."""
    if replicas is None:
        return short_hash(f'{{"pod": {pod_json}}}', 16)
    return short_hash(f'{{"pod": {pod_json}, "replicas": {json.dumps(replicas)}}}', 16)


def settings_hashes(pod_spec: Mapping[str, Any], replicas: int) -> tuple[str, str]:
    """(settings_hash(pod_spec, replicas), settings_hash(pod_spec)), encoding the spec once."""
    pod_json = json.dumps(pod_spec, sort_keys=True)
    return _settings_digest(pod_json, replicas), _settings_digest(pod_json, None)


def pool_deployment(
    name: str,
    namespace: str,
    uid: str,
    spec: MTPInferenceSpec,
    plan: PoolPlan,
    default_image: str,
    cluster_profiles: Mapping[str, int] | None = None,
    model_cache: EffectiveCache | None = None,
    replicas: int | None = None,
) -> dict[str, Any]:
    """The Deployment for one (resource, GPU product) pool (`replicas`: spec.replicas unless
    a canary replica runs beside it)."""
    config = pool_config(spec, plan, cluster_profiles or {}, model_cache)
    pod_spec = _pod_spec(spec, plan, config, spec.image or default_image, model_cache)
    replicas = spec.replicas if replicas is None else replicas
    digest, template_digest = settings_hashes(pod_spec, replicas)
    labels = _pool_labels(name, spec, plan)
    command = json.dumps(build_argv(plan.serve))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": pool_deployment_name(name, plan.gpu_product, plan.traffic_class),
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": {
                ANNOTATION_COMMAND: command,
                ANNOTATION_SETTINGS_HASH: digest,
                ANNOTATION_GPU_PRODUCT: plan.gpu_product,
                **_class_annotation(plan),
            },
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": {
            "replicas": replicas,
            "selector": {
                "matchLabels": pool_selector(name, plan.gpu_product, plan.traffic_class)
            },
            # No surge unless the product has a spare slot: the operator decides that when it
            # rolls the pool (control.pool_writes, rollout.surge_decision).
            "strategy": {"type": "RollingUpdate", "rollingUpdate": dict(NO_SURGE)},
            "template": {
                "metadata": {
                    # the owner's UID on the pods only (the selector is immutable): the
                    # Service selects on it (naming.owner_label_rolled_out, issue 36)
                    "labels": {**labels, LABEL_OWNER_UID: uid},
                    "annotations": {ANNOTATION_SETTINGS_HASH: template_digest},
                },
                "spec": pod_spec,
            },
        },
    }


def pool_disruption_budget(deploy: Mapping[str, Any]) -> dict[str, Any]:
    """The pool's PodDisruptionBudget, from its Deployment (same name, labels, selector and
    owner, the resource): voluntary evictions (node drains) keep one replica serving when the
    pool has two or more (rollout.min_available)."""
    meta = deploy["metadata"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": dict(meta["labels"]),
            "ownerReferences": [dict(o) for o in meta["ownerReferences"]],
        },
        "spec": {
            "minAvailable": min_available(deploy["spec"]["replicas"]),
            "selector": {"matchLabels": dict(deploy["spec"]["selector"]["matchLabels"])},
        },
    }


def canary_pod(
    name: str,
    namespace: str,
    uid: str,
    spec: MTPInferenceSpec,
    plan: PoolPlan,
    default_image: str,
    cluster_profiles: Mapping[str, int] | None = None,
    model_cache: EffectiveCache | None = None,
) -> dict[str, Any]:
    """One replica of a pool at a tuning trial's K (`plan`), beside the pool's Deployment.

    A bare Pod with the pool's labels, so the resource's Service (and the PodMonitor) send it
    the same traffic as the other replicas; the Deployment's ReplicaSets never claim it (their
    selectors carry a pod-template-hash it has not). Owned by the MTPInference.
    """
    config = pool_config(spec, plan, cluster_profiles or {}, model_cache)
    pod_spec = _pod_spec(spec, plan, config, spec.image or default_image, model_cache)
    labels = {**_pool_labels(name, spec, plan), LABEL_CANARY: "true", LABEL_OWNER_UID: uid}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": canary_pod_name(name, plan.gpu_product, plan.k, plan.traffic_class),
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                ANNOTATION_COMMAND: json.dumps(build_argv(plan.serve)),
                ANNOTATION_SETTINGS_HASH: settings_hash(pod_spec),
                ANNOTATION_GPU_PRODUCT: plan.gpu_product,
                **_class_annotation(plan),
            },
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": pod_spec,
    }


def service(name: str, namespace: str, uid: str) -> dict[str, Any]:
    """One Service in front of every pool of the resource (OpenAI API and metrics). It selects
    the resource's pods by the owner's UID too (LABEL_OWNER_UID), so a pod that only copies
    the pool's labels gets no traffic; `label_only_service` is the selector it replaces on a
    resource whose pools predate that label."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(name),
            "namespace": namespace,
            "labels": resource_labels(name),
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": {
            "selector": {LABEL_RESOURCE: label_value(name), LABEL_OWNER_UID: uid},
            "ports": [
                {"name": "http", "port": DEFAULT_PORT, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "metrics",
                    "port": METRICS_PORT,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                },
            ],
        },
    }


def label_only_service(svc: Mapping[str, Any]) -> dict[str, Any]:
    """`svc` (from `service`) selecting by the resource label alone, as before issue 36: kept
    while any pod of the resource may lack LABEL_OWNER_UID (pools made by an earlier version
    get it with their next roll), so tightening the selector never drops a serving pod."""
    spec = dict(svc["spec"])
    spec["selector"] = {k: v for k, v in spec["selector"].items() if k != LABEL_OWNER_UID}
    return {**svc, "spec": spec}


def desired_objects(
    name: str,
    namespace: str,
    uid: str,
    spec: MTPInferenceSpec,
    plans: list[PoolPlan],
    default_image: str,
    cluster_profiles: Mapping[str, int] | None = None,
    model_cache: EffectiveCache | None = None,
    canaries: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """The Service, then one pool per plan: a Deployment, or a LeaderWorkerSet of groups of
    `plan.nodes` pods when a replica spans several nodes (lws.py). A pool in `canaries`, GPU
    products with a canary replica running, gets one replica less."""
    objs = [service(name, namespace, uid)]
    for p in plans:
        deploy = pool_deployment(
            name, namespace, uid, spec, p, default_image, cluster_profiles, model_cache,
            spec.replicas - 1 if p.key in canaries and spec.replicas >= 2 else None,
        )
        if p.nodes > 1 and p.fit is not None:
            deploy = pool_leaderworkerset(deploy, p.nodes, p.fit.gpus_per_pod)
        objs.append(deploy)
    # traffic classes: after the pools (callers index the pools as objects[1:1 + len(plans)])
    objs += routing_objects(name, namespace, owner_reference(name, uid), spec, plans)
    return objs


class DesiredSet:
    """`desired_objects` for one set of inputs, rendered when a pass needs the objects and let
    go when the pass ends (`release`). Most passes need none of them: they compare each pool
    against the drift result of this same set (keyed by the instance) and read the settings
    digests, which are kept. Holding the rendered objects between passes cost ~36 KB a
    resource (36 MB at 1,000 resources); rendering again costs ~0.3 ms, when a pool changed or
    is written. The caller keeps one instance while the inputs stay the same."""

    def __init__(self, inputs: Any, *args: Any) -> None:
        self.inputs = inputs
        self._args = args  # desired_objects' arguments
        self._objects: list[dict[str, Any]] | None = None
        self.hashes: tuple[str, ...] = ()  # each pool's settings digest, in plan order
        self.objects()

    def objects(self) -> list[dict[str, Any]]:
        """The Service, then one Deployment per plan (rendered again after `release`)."""
        if self._objects is None:
            self._objects = desired_objects(*self._args)
            self.hashes = tuple(  # the pools' (routing objects carry no settings hash)
                o["metadata"]["annotations"][ANNOTATION_SETTINGS_HASH]
                for o in self._objects[1:]
                if ANNOTATION_SETTINGS_HASH in (o["metadata"].get("annotations") or {})
            )
        return self._objects

    def release(self) -> None:
        self._objects = None
