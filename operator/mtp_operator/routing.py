"""The routing objects of a resource with traffic classes (spec.speculative.classes). Pure.

A request reaches the pool of its class through the Kubernetes routing layer: a Gateway (any
Gateway API Inference Extension implementation) routes to the resource's `InferencePool`,
which selects every pool pod of the resource; the pool's endpoint picker (EPP) picks one pod
per request, and its configuration (rendered here, in a ConfigMap) first keeps only the pods
of the request's class, by the class label the operator puts on each class pool
(`mtp-operator.io/traffic-class`; length classes also carry `llm-d.ai/context-length-range`).
A plain Service per class serves clients that know their class.

Versions, read from the Go module `sigs.k8s.io/gateway-api-inference-extension`:
- `InferencePool`: `inference.networking.k8s.io/v1` (v1.6.2's `api/v1`, CRD
  `config/crd/bases/inference.networking.k8s.io_inferencepools.yaml`).
- The EPP's configuration: `inference.networking.x-k8s.io/v1alpha1` `EndpointPickerConfig`
  (v1.5.0's `apix/config/v1alpha1`, the last version with the full EPP; v1.6.2 moved it to
  llm-d). Its plugins: `queue-scorer`, `kv-cache-utilization-scorer`, `prefix-cache-scorer`
  (the EPP's default weights 2, 2, 3), `max-score-picker`, `single-profile-handler`. No EPP
  version served here has a filter by pod label or by prompt length, so the class filter is a
  plugin of its own type, `mtp-traffic-class-filter` (parameters: `TrafficClassFilter`
  below), that the EPP built from `runtime/picker` registers (docs/routing.md); that picker
  decodes these parameters strictly, so a change here must change it too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.naming import (
    LABEL_CONTEXT_LENGTH_RANGE,
    LABEL_OWNER_UID,
    LABEL_RESOURCE,
    LABEL_TRAFFIC_CLASS,
    class_service_name,
    inference_pool_name,
    label_value,
    picker_config_name,
    resource_labels,
)
from mtp_operator.planning import PoolPlan
from mtp_runtime.vllm_command import DEFAULT_PORT

INFERENCE_POOL_API = "inference.networking.k8s.io/v1"
PICKER_CONFIG_API = "inference.networking.x-k8s.io/v1alpha1"
PICKER_CONFIG_KEY = "config.yaml"  # the ConfigMap key the EPP's --config-file points at
PICKER_GRPC_PORT = 9002  # the EPP's ext-proc port (its --grpc-port default)
CLASS_FILTER_TYPE = "mtp-traffic-class-filter"
CLASS_FILTER_NAME = "traffic-class"
# the EPP's own default scorers and weights (v1.5.0 pkg/epp/config/loader/defaults.go)
SCORERS = (("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0),
           ("prefix-cache-scorer", 3.0))
PICKER = "max-score-picker"
PROFILE_HANDLER = "single-profile-handler"


def picker_name(resource: str) -> str:
    """The endpoint picker's Service (the user runs the EPP under this name)."""
    return f"{inference_pool_name(resource)}-epp"


def class_filter_parameters(spec: MTPInferenceSpec) -> dict[str, Any]:
    """`mtp-traffic-class-filter`'s parameters: which label names a pod's class, and how a
    request finds its class: header classes first (in list order), then the prompt-length
    ranges (tokens, both ends included), else the default class; with no match and no
    default, every pod stays (the filter never leaves a request without a pod)."""
    classes: list[dict[str, Any]] = []
    default = None
    for c in spec.speculative.classes or ():
        if c.header is not None:
            classes.append({"name": c.name, "header": {"name": c.header.name.lower(),
                                                      "value": c.header.value}})
        elif c.prompt_tokens is not None:
            classes.append({"name": c.name, "promptTokens": {"min": c.prompt_tokens.min,
                                                            "max": c.prompt_tokens.upper}})
        else:
            default = c.name
    out: dict[str, Any] = {
        "classLabel": LABEL_TRAFFIC_CLASS,
        "contextLengthLabel": LABEL_CONTEXT_LENGTH_RANGE,
        "classes": sorted(classes, key=lambda c: ("promptTokens" in c, c["name"])),
    }
    if default is not None:
        out["defaultClass"] = default
    return out


def picker_config(spec: MTPInferenceSpec) -> dict[str, Any]:
    """The EndpointPickerConfig: the class filter, then the EPP's default scorers and the
    max-score picker, in one scheduling profile."""
    plugins: list[dict[str, Any]] = [
        {"name": CLASS_FILTER_NAME, "type": CLASS_FILTER_TYPE,
         "parameters": class_filter_parameters(spec)},
        *({"name": t, "type": t} for t, _ in SCORERS),
        {"name": PICKER, "type": PICKER},
        {"name": PROFILE_HANDLER, "type": PROFILE_HANDLER},
    ]
    profile = [{"pluginRef": CLASS_FILTER_NAME}]
    profile += [{"pluginRef": t, "weight": w} for t, w in SCORERS]
    profile += [{"pluginRef": PICKER}]
    return {
        "apiVersion": PICKER_CONFIG_API,
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": profile}],
    }


def inference_pool(
    name: str, namespace: str, owner: Mapping[str, Any]
) -> dict[str, Any]:
    """The resource's InferencePool: every pool pod of the resource (all classes, all GPU
    products), vLLM's port, and the endpoint picker that chooses among them."""
    return {
        "apiVersion": INFERENCE_POOL_API,
        "kind": "InferencePool",
        "metadata": {
            "name": inference_pool_name(name),
            "namespace": namespace,
            "labels": resource_labels(name),
            "ownerReferences": [dict(owner)],
        },
        "spec": {
            "selector": {"matchLabels": {LABEL_RESOURCE: label_value(name)}},
            "targetPorts": [{"number": DEFAULT_PORT}],
            "endpointPickerRef": {
                "name": picker_name(name),
                "port": {"number": PICKER_GRPC_PORT},
                "failureMode": "FailClose",
            },
        },
    }


def picker_config_map(
    name: str, namespace: str, owner: Mapping[str, Any], spec: MTPInferenceSpec
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": picker_config_name(name),
            "namespace": namespace,
            "labels": resource_labels(name),
            "ownerReferences": [dict(owner)],
        },
        "data": {PICKER_CONFIG_KEY: yaml.safe_dump(picker_config(spec), sort_keys=False)},
    }


def class_service(
    name: str, namespace: str, owner: Mapping[str, Any], traffic_class: str
) -> dict[str, Any]:
    """A plain Service of one class's pools (every GPU product), OpenAI API only."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": class_service_name(name, traffic_class),
            "namespace": namespace,
            "labels": {**resource_labels(name), LABEL_TRAFFIC_CLASS: traffic_class},
            "ownerReferences": [dict(owner)],
        },
        "spec": {
            # a class pool's pods carry the owner's UID from their first version (issue 36)
            "selector": {LABEL_RESOURCE: label_value(name), LABEL_TRAFFIC_CLASS: traffic_class,
                         LABEL_OWNER_UID: owner["uid"]},
            "ports": [
                {"name": "http", "port": DEFAULT_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def routing_objects(
    name: str,
    namespace: str,
    owner: Mapping[str, Any],
    spec: MTPInferenceSpec,
    plans: Sequence[PoolPlan] = (),
) -> list[dict[str, Any]]:
    """Nothing without classes; with them the InferencePool, the picker's ConfigMap and one
    Service per class (`plans` is unused: every class has pools on every product)."""
    classes = spec.speculative.classes or ()
    if not classes:
        return []
    objs = [inference_pool(name, namespace, owner), picker_config_map(name, namespace, owner,
                                                                      spec)]
    objs += [class_service(name, namespace, owner, c.name) for c in classes]
    return objs
