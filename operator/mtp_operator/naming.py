"""Deterministic names and labels for the objects the operator owns. Pure.

Names must stay within Kubernetes' limits (63 characters for labels and Service names) and
be the same on every reconcile, so a long resource name is cut and given a short hash.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_RESOURCE = "mtp-operator.io/mtpinference"
LABEL_GPU_PRODUCT = "mtp-operator.io/gpu-product"
LABEL_CANARY = "mtp-operator.io/canary"  # a tuning trial's pod beside the pool's Deployment
# The owning MTPInference's metadata.uid on every pod the operator makes (pool templates,
# canaries): the Service selects on it, so a pod that merely copies the pool's other labels
# gets no traffic (issue 36; see `pool_member` and `owner_label_rolled_out`).
LABEL_OWNER_UID = "mtp-operator.io/owner-uid"
# The label the Deployment controller puts on each ReplicaSet's pods (its name's suffix).
LABEL_POD_TEMPLATE_HASH = "pod-template-hash"
# Traffic classes (spec.speculative.classes): the class a pool serves, and for a prompt-length
# class its range as llm-d's context-length-aware scorer reads it ("min-max", tokens).
LABEL_TRAFFIC_CLASS = "mtp-operator.io/traffic-class"
LABEL_CONTEXT_LENGTH_RANGE = "llm-d.ai/context-length-range"
MANAGED_BY = "mtp-operator"
APP_NAME = "mtp-inference"

# On a Namespace: `enabled` lets the alert webhook roll back the MTPInferences in it (with the
# operator setting alerts.requireNamespaceOptIn, the default; adapters/namespaces.py)
LABEL_ALERT_ROLLBACK = "mtp-operator.io/alert-rollback"
ALERT_ROLLBACK_ENABLED = "enabled"
ANNOTATION_COMMAND = "mtp-operator.io/vllm-command"
ANNOTATION_SETTINGS_HASH = "mtp-operator.io/settings-hash"
ANNOTATION_RESET_ROLLBACK = "mtp-operator.io/reset-rollback"
ANNOTATION_GPU_PRODUCT = "mtp-operator.io/gpu-product"  # exact value, never cut like labels
ANNOTATION_TRAFFIC_CLASS = "mtp-operator.io/traffic-class"

MAX_NAME = 63
_INVALID = re.compile(r"[^a-z0-9-]+")


def short_hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def dns_label(*parts: str, max_len: int = MAX_NAME) -> str:
    """Join parts into a DNS-1123 label; too long → cut and suffixed with a stable hash."""
    raw = "-".join(parts)
    name = _INVALID.sub("-", raw.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if len(name) <= max_len:
        return name
    suffix = short_hash(raw)
    return f"{name[: max_len - len(suffix) - 1].rstrip('-')}-{suffix}"


def plain_product_slug(product: str) -> str:
    """`NVIDIA-H100-80GB-HBM3` → `h100-80gb-hbm3`: the vendor prefix says nothing here. Lossy
    (`H200`, `NVIDIA_H200` and `NVIDIA-H200` give one slug): for display, never for names."""
    slug = _INVALID.sub("-", product.lower()).strip("-")
    return slug.removeprefix("nvidia-") or "gpu"


_HASH_TAIL = re.compile(r"-[0-9a-f]{8}$")
_PLAIN_SLUG = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")  # what dns_label leaves as it is


def _canonical_label(slug: str) -> str:
    """The one label whose plain slug is `slug` and that names keep unhashed: GFD's spelling
    (`NVIDIA-` and upper case; `Tesla-` for the cards GFD labels so)."""
    if slug.startswith("tesla-"):
        return "Tesla-" + slug.removeprefix("tesla-").upper()
    return "NVIDIA-" + slug.upper()


def product_slug(product: str) -> str:
    """A product's part of object names, one per label value: `NVIDIA-H100-80GB-HBM3` →
    `h100-80gb-hbm3`. A label that normalising changed beyond that (another case, `_`, spaces,
    no `NVIDIA-` prefix, dots) gets a short hash of the exact label (`H200` →
    `h200-<hash>`), and so does a canonical one whose slug already ends like a hash, so two
    labels never share a pool. Injective because the unhashed slugs come from exactly one
    label each (`_canonical_label` inverts them) and never end in `-<8 hex>`, while every
    hashed one does."""
    slug = plain_product_slug(product)
    canonical = product == _canonical_label(slug) and _PLAIN_SLUG.fullmatch(slug)
    if canonical and not _HASH_TAIL.search(slug):
        return slug
    return f"{re.sub(r'-{2,}', '-', slug.strip('-'))}-{short_hash(product)}"


def pool_key(product: str, traffic_class: str | None = None) -> str:
    """A pool's identity within its resource: the GPU product, or `product/class` for a class
    pool (a label value has no `/`, a class name neither, so the split is unique)."""
    return product if traffic_class is None else f"{product}/{traffic_class}"


def split_pool_key(key: str) -> tuple[str, str | None]:
    """(product, class or None) of a pool_key."""
    product, sep, traffic_class = key.rpartition("/")
    return (product, traffic_class) if sep else (key, None)


def _pool_slug(product: str, traffic_class: str | None) -> str:
    """The pool's part of names. A class pool's is the product's slug, the class and a short
    hash of both, so it always ends in `-<8 hex>` after a class name: it never equals an
    unclassed pool's name of another product (a slug ending like `-long`) of the same resource
    while classes are switched on or off, and two class pools differ by their hash input."""
    slug = product_slug(product)
    if traffic_class is None:
        return slug
    return f"{slug}-{traffic_class}-{short_hash(pool_key(product, traffic_class))}"


def pool_deployment_name(resource: str, product: str, traffic_class: str | None = None) -> str:
    return dns_label(resource, _pool_slug(product, traffic_class))


def canary_pod_name(
    resource: str, product: str, k: int, traffic_class: str | None = None
) -> str:
    """The pod a canary trial of K runs in (K in the name: a pod's spec cannot change)."""
    return dns_label(resource, _pool_slug(product, traffic_class), f"canary-k{k}")


def service_name(resource: str) -> str:
    # Never plain `vllm`: Kubernetes would inject VLLM_PORT=tcp://..., which vLLM misreads.
    name = dns_label(resource, "openai")
    # A Service name is a DNS-1035 label (it starts with a letter); a resource name may start
    # with a digit (`7b-chat`).
    return name if name[:1].isalpha() else dns_label("mtpi", resource, "openai")


def label_value(value: str) -> str:
    """Label values are at most 63 characters; longer ones are cut with a stable hash."""
    if len(value) <= MAX_NAME:
        return value
    suffix = short_hash(value)
    return f"{value[: MAX_NAME - len(suffix) - 1]}-{suffix}"


def resource_labels(resource: str) -> dict[str, str]:
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: label_value(resource),
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_RESOURCE: label_value(resource),
    }


def pool_labels(
    resource: str,
    product: str,
    traffic_class: str | None = None,
    context_length_range: str | None = None,
) -> dict[str, str]:
    labels = {**resource_labels(resource), LABEL_GPU_PRODUCT: label_value(product)}
    if traffic_class is not None:
        labels[LABEL_TRAFFIC_CLASS] = traffic_class
    if context_length_range is not None:
        labels[LABEL_CONTEXT_LENGTH_RANGE] = context_length_range
    return labels


def pool_selector(
    resource: str, product: str, traffic_class: str | None = None
) -> dict[str, str]:
    selector = {LABEL_RESOURCE: label_value(resource), LABEL_GPU_PRODUCT: label_value(product)}
    if traffic_class is not None:
        selector[LABEL_TRAFFIC_CLASS] = traffic_class
    return selector


def class_service_name(resource: str, traffic_class: str) -> str:
    """The plain Service of one class (clients that know their class): `<resource>-<class>-
    class`, never a resource's `-openai` Service, and the class (no `-` in it) is the part
    before `-class`, so two (resource, class) pairs get two names."""
    name = dns_label(resource, traffic_class, "class")
    return name if name[:1].isalpha() else dns_label("mtpi", resource, traffic_class, "class")


def inference_pool_name(resource: str) -> str:
    """The InferencePool of a resource with classes (a DNS-1035 label, like a Service)."""
    name = dns_label(resource, "pool")
    return name if name[:1].isalpha() else dns_label("mtpi", resource, "pool")


def picker_config_name(resource: str) -> str:
    """The ConfigMap with the endpoint picker's configuration."""
    return dns_label(resource, "epp-config")


def controller_ref(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference marked `controller: true` of an object's metadata, if any."""
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def pool_member(meta: Mapping[str, Any], resource_uid: str, deployment_name: str) -> bool:
    """Is the pod with metadata `meta` one of the pool's, proven by ownership, not by labels?

    A pool pod is controlled by a ReplicaSet of the pool's Deployment: the Deployment
    controller names each `<deployment>-<pod-template-hash>` and puts that hash on its pods.
    A canary (label `mtp-operator.io/canary`) is controlled by the MTPInference itself, by
    UID. A pod that only carries the pool's labels (a copy of a manifest, another chart's
    pods) is no member. Exact names: a Deployment `a`'s pods are not those of `a-b`."""
    ref = controller_ref(meta)
    if ref is None or not resource_uid:
        return False
    labels = meta.get("labels") or {}
    if labels.get(LABEL_CANARY) == "true":
        return ref.get("kind") == "MTPInference" and ref.get("uid") == resource_uid
    if not str(ref.get("apiVersion", "")).startswith("apps/"):
        return False
    if ref.get("kind") == "StatefulSet":  # a LeaderWorkerSet pool's leader: its StatefulSet
        return ref.get("name") == deployment_name  # is named as the LeaderWorkerSet
    template_hash = labels.get(LABEL_POD_TEMPLATE_HASH)
    return (
        ref.get("kind") == "ReplicaSet"
        and bool(template_hash)
        and ref.get("name") == f"{deployment_name}-{template_hash}"
    )


def owner_label_rolled_out(
    deployments: Iterable[Mapping[str, Any]],
    canaries: Iterable[Mapping[str, Any]],
    resource_uid: str,
) -> bool:
    """May the resource's Service select on LABEL_OWNER_UID without dropping a serving pod?

    True once every pool Deployment's pod template carries the label with the resource's
    UID and its rollout is over (the controller saw the last generation, and every pod it
    counts is of the current template), and every canary pod (metadata) carries it. Pools
    made by an earlier version get the label with their next roll (a K change, a rollback,
    a spec edit): labels are not a drifted field, so the upgrade itself rolls nothing."""
    for dep in deployments:
        spec = dep.get("spec") or {}
        lws = spec.get("leaderWorkerTemplate")  # a LeaderWorkerSet pool: its leaders serve
        template = (lws or {}).get("leaderTemplate") if lws else spec.get("template")
        template_meta = (template or {}).get("metadata") or {}
        if (template_meta.get("labels") or {}).get(LABEL_OWNER_UID) != resource_uid:
            return False
        status = dep.get("status") or {}
        generation = (dep.get("metadata") or {}).get("generation")
        want = spec.get("replicas", 1)
        if lws:  # keeps no observedGeneration: its conditions say a rollout is under way
            if any(c.get("type") in ("Progressing", "UpdateInProgress")
                   and c.get("status") == "True" for c in status.get("conditions") or []):
                return False
        elif generation is not None and status.get("observedGeneration", -1) < generation:
            return False
        if (status.get("replicas") or 0) != (status.get("updatedReplicas") or 0):
            return False
        if (status.get("updatedReplicas") or 0) < want:
            return False
    return all(
        (meta.get("labels") or {}).get(LABEL_OWNER_UID) == resource_uid for meta in canaries
    )
