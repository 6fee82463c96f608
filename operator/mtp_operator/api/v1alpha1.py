"""MTPInference v1alpha1: the single source of truth for the CRD (crds/ is generated from here).

Field names are the public contract. Python attributes are snake_case; the wire format is
camelCase. Rules the API server can check live in the schema (bounds, enums) and in CEL
(`x-kubernetes-validations`); rules that need the cluster or vLLM's own logic are checked by
the operator (see validation.py) and reported with the same kind of message.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from mtp_operator.api.base import Model as _Model
from mtp_operator.api.classes import MAX_CLASSES, TrafficClass
from mtp_operator.api.tuning import TUNING_CEL, BatchSizeRange, PoolTuningStatus, TuningSpec
from mtp_runtime.drain import DRAIN_SECONDS_ENV
from mtp_runtime.gpu_profiles import PoolSource
from mtp_runtime.model_cache import CACHE_ROOT_ENV
from mtp_runtime.pool_config import ENV_VAR
from mtp_runtime.vllm_command import MAX_SPECULATIVE_TOKENS, MODEL_ID_PATTERN

GROUP = "mtp-operator.io"
VERSION = "v1alpha1"
KIND = "MTPInference"
PLURAL = "mtpinferences"
SINGULAR = "mtpinference"
SHORT_NAMES = ["mtpi"]

# Defaults the rollback block starts from. MTPHitRateLow: the field report's "alert below 0.88
# for 5 m". MTPErrorPropagationHigh: 0.40 of draft tokens wasted behind an earlier rejection
# (mtp-metrics.md's curve: a healthy K=6 pool at per-position acceptance 0.8 wastes 0.39; K=4
# only passes 0.40 below acceptance 0.69, K=2 below 0.2), so it fires only when a deep draft
# chain is mostly thrown away, where stepping K down helps.
DEFAULT_MIN_HIT_RATE = 0.88
DEFAULT_MAX_ERROR_PROPAGATION_RATE = 0.40
MAX_ROLLBACK_HISTORY = 20
INT32_MAX = 2**31 - 1  # Kubernetes' int32 fields (a Deployment's replicas)
MAX_DURATION_SECONDS = 30 * 24 * 3600  # rollback timings: 30 days at most
MAX_MTP_LAYERS = 64
# The pod parts a spec passes through (env, tolerations): what Kubernetes accepts, and the
# environment variables the operator sets itself in every pool container.
RESERVED_ENV = (ENV_VAR, "VLLM_USE_MODELSCOPE", DRAIN_SECONDS_ENV, CACHE_ROOT_ENV)
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# Kubernetes' resource.Quantity (k8s.io/apimachinery/pkg/api/resource), as its OpenAPI schema
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
MAX_ENV = 256
MAX_TOLERATIONS = 64
MAX_EXTRA_ARG_LENGTH = 1024  # keeps the extraArgs CEL rule within the API server's cost budget
# The alerts that may roll a pool back: the shipped rules' (rollback/signals.py takes the names
# from here). An alert of any other name is never a rollback signal, so spec.rollback.alertNames
# takes these two only.
ALERT_HIT_RATE_LOW = "MTPHitRateLow"
ALERT_ERROR_PROPAGATION_HIGH = "MTPErrorPropagationHigh"
RollbackAlertName = Literal["MTPHitRateLow", "MTPErrorPropagationHigh"]
ROLLBACK_ALERT_NAMES = (ALERT_HIT_RATE_LOW, ALERT_ERROR_PROPAGATION_HIGH)
# spec.rollback.alertMatchers: equality matchers on a webhook alert's labels, Prometheus label
# names (https://prometheus.io/docs/concepts/data_model/); bounded so the CEL rule on the keys
# stays within the API server's cost budget.
MAX_ALERT_MATCHERS = 16
MAX_ALERT_MATCHER_VALUE_LENGTH = 1024
LABEL_NAME_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"


class SpeculativeSpec(_Model):
    """How the pools speculate. K is per GPU pool unless numSpeculativeTokens is set."""

    method: str = Field(
        "mtp",
        description="vLLM speculative method: `mtp` or one of vLLM 0.33's model-specific MTP "
        "aliases (e.g. `deepseek_mtp`, `qwen3_next_mtp`).",
        min_length=1,
    )
    num_speculative_tokens: int | Literal["auto"] = Field(
        "auto",
        description="K: `auto` (per GPU product, from the profile table) or an integer "
        f"0-{MAX_SPECULATIVE_TOKENS} applied to every pool; 0 turns speculation off.",
    )
    profiles: dict[str, Annotated[int, Field(le=MAX_SPECULATIVE_TOKENS)]] | None = Field(
        None,
        max_length=64,
        description="Per-GPU K overrides for `auto`, keyed by a `nvidia.com/gpu.product` value "
        "or a family such as `H100`.",
    )
    max_speculative_tokens: int | None = Field(
        None,
        ge=0,
        le=MAX_SPECULATIVE_TOKENS,
        description="Upper bound on any pool's K (profile values are capped to it).",
    )
    mtp_layers: int | None = Field(
        None,
        ge=1,
        le=MAX_MTP_LAYERS,
        description="The model's MTP depth (n_predict). vLLM rejects K above it unless K is a "
        "multiple of it; profile values are lowered to fit.",
    )
    batch_size_schedule: list[BatchSizeRange] | None = Field(
        None,
        max_length=64,
        description="K per batch size (vLLM's num_speculative_tokens_per_batch_size): vLLM "
        "picks each engine step's K by how many requests run; ranges sorted, not overlapping, "
        "the first from batch size 1; each K capped at the pool's K.",
    )
    tuning: TuningSpec = Field(
        default_factory=TuningSpec,  # type: ignore[arg-type]
        description="Measured K: find each pool's K with the most output tokens per second.",
    )
    classes: list[TrafficClass] | None = Field(
        None,
        max_length=MAX_CLASSES,
        description="Traffic classes, each with its own K and its own pool per GPU product: "
        "by prompt length in tokens (promptTokens ranges: no overlap, no gap) or by a request "
        "header value; at most one default class (neither). The endpoint picker routes each "
        "request to its class's pools (the InferencePool the operator renders).",
    )


class RollbackSpec(_Model):
    """When and how the operator backs a pool's speculative settings off by itself."""

    enabled: bool = Field(True, description="Roll back automatically when an alert fires.")
    min_hit_rate: float = Field(
        DEFAULT_MIN_HIT_RATE, ge=0, le=1, description="MTPHitRateLow fires below this hit rate."
    )
    max_error_propagation_rate: float = Field(
        DEFAULT_MAX_ERROR_PROPAGATION_RATE,
        ge=0,
        le=1,
        description="MTPErrorPropagationHigh fires above this error-propagation rate.",
    )
    cooldown_seconds: int = Field(
        600,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="After a rollback, further alerts for the pool are ignored this long. Keep "
        "it at least the alert's window plus its `for` (5m + 5m for the shipped rules): until "
        "then the alert still sees data from before the rollback.",
    )
    stabilization_seconds: int = Field(
        600,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="Settings that run this long without an alert become the pool's known-good.",
    )
    window_seconds: int = Field(
        300,
        ge=1,
        le=MAX_DURATION_SECONDS,
        description="Built-in evaluator: the window the figures are computed over.",
    )
    for_seconds: int = Field(
        300,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="Built-in evaluator: how long a threshold must stay crossed before acting.",
    )
    min_drafts: int = Field(
        50,
        ge=1,
        le=INT32_MAX,
        description="Built-in evaluator: fewer drafts than this in the window counts as no data.",
    )
    alert_names: list[RollbackAlertName] = Field(
        list(ROLLBACK_ALERT_NAMES),  # pydantic copies a mutable default per instance
        min_length=1,
        max_length=len(ROLLBACK_ALERT_NAMES),
        description="The alerts that may roll this resource's pools back, from the webhook and "
        "the built-in evaluator alike (default both; `enabled: false` turns rollback off).",
    )
    alert_matchers: (
        dict[str, Annotated[str, Field(max_length=MAX_ALERT_MATCHER_VALUE_LENGTH)]] | None
    ) = Field(
        None,
        max_length=MAX_ALERT_MATCHERS,
        description="Webhook alerts act only when they carry every one of these labels with "
        "exactly this value (`label: \"\"` matches an alert without the label), e.g. "
        "`{cluster: prod}`; Prometheus label names. The built-in evaluator's are not matched.",
    )

    @field_validator("alert_names")
    @classmethod
    def _unique_names(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError("must not name an alert twice")
        return names

    @field_validator("alert_matchers")
    @classmethod
    def _label_names(cls, matchers: dict[str, str] | None) -> dict[str, str] | None:
        for label in matchers or {}:
            if not re.fullmatch(LABEL_NAME_PATTERN, label):
                raise ValueError(
                    f"{label!r} is not a Prometheus label name ({LABEL_NAME_PATTERN})"
                )
        return matchers


# spec.rollout.drainSeconds: how long a leaving pool pod may finish its requests (issue 37).
# 0 skips the wait (the endpoint still leaves first); one hour bounds a pod's termination.
DEFAULT_DRAIN_SECONDS = 120
MAX_DRAIN_SECONDS = 3600


class RolloutSpec(_Model):
    """How a pool pod is replaced when K (or any setting) changes."""

    drain_seconds: int = Field(
        DEFAULT_DRAIN_SECONDS,
        ge=0,
        le=MAX_DRAIN_SECONDS,
        description="A leaving pool pod stops being Ready first, then has up to this many "
        "seconds to finish the requests it holds before vLLM stops (0 to 3600; size it for "
        "the longest generation). The pod's terminationGracePeriodSeconds is this plus 30.",
    )


# Where a pool's model cache is mounted in its pods, whatever the volume; the runtime points
# the model hub client there (mtp_runtime.model_cache).
MODEL_CACHE_MOUNT_PATH = "/model-cache"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class ClaimCache(_Model):
    """An existing PersistentVolumeClaim in the resource's namespace, managed by the user."""

    claim_name: str = Field(
        ...,
        min_length=1,
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="Name of the claim (same namespace). ReadWriteMany lets every pool and "
        "replica share it; ReadWriteOnce only pods on one node.",
    )


class HostPathCache(_Model):
    """A folder on each node: fast and shared by every pod on the node, but it gives the pods
    write access to the node's file system (the operator allows only the folders listed in
    its settings, `modelCache.allowedHostPaths`)."""

    path: str = Field(
        ...,
        min_length=2,
        max_length=4096,
        pattern=r"^/",
        description="Absolute folder on the node; must be under one of the operator's "
        "`modelCache.allowedHostPaths`.",
    )

    @field_validator("path")
    @classmethod
    def _clean_path(cls, value: str) -> str:
        if ".." in value.split("/"):
            raise ValueError("must not contain `..`")
        return value


class NoCache(_Model):
    """No cache volume: each new pod downloads the model again (the default)."""


class ModelCacheSpec(_Model):
    """Where a pool's pods keep the model's weights, so a restart (a change of K, a rollback)
    reads them instead of downloading them again. Exactly one of persistentVolumeClaim,
    hostPath and none."""

    persistent_volume_claim: ClaimCache | None = Field(
        None, description="Keep the weights on an existing PersistentVolumeClaim."
    )
    host_path: HostPathCache | None = Field(
        None, description="Keep the weights in a folder of the node."
    )
    none: NoCache | None = Field(
        None, description="No cache: every new pod downloads the model (the default)."
    )
    read_only: bool = Field(
        False,
        description="Mount the cache read-only (a separate job fills it); vLLM then runs "
        "offline and fails if the model is not in the cache.",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> ModelCacheSpec:
        chosen = [k for k in ("persistent_volume_claim", "host_path", "none") if getattr(self, k)]
        if len(chosen) != 1:
            raise ValueError(MODEL_CACHE_ONE_OF)
        if self.read_only and self.none is not None:
            raise ValueError(MODEL_CACHE_READ_ONLY)
        return self

    @property
    def kind(self) -> Literal["persistentVolumeClaim", "hostPath", "none"]:
        if self.persistent_volume_claim is not None:
            return "persistentVolumeClaim"
        return "hostPath" if self.host_path is not None else "none"


MODEL_CACHE_ONE_OF = "set exactly one of persistentVolumeClaim, hostPath and none"
MODEL_CACHE_READ_ONLY = "readOnly needs a cache volume (persistentVolumeClaim or hostPath)"
MODEL_CACHE_CEL = [
    {
        "rule": "(has(self.persistentVolumeClaim) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) + "
        "(has(self.none) ? 1 : 0) == 1",
        "message": MODEL_CACHE_ONE_OF,
    },
    {
        "rule": "!has(self.none) || !has(self.readOnly) || !self.readOnly",
        "message": MODEL_CACHE_READ_ONLY,
        "fieldPath": ".readOnly",
        "reason": "FieldValueInvalid",
    },
]
HOST_PATH_CEL = [
    {
        "rule": "!self.matches('(^|/)[.][.](/|$)')",
        "message": "must not contain `..`",
    }
]


DEFAULT_FIT_HEADROOM = 0.2
DEFAULT_MAX_NODES_PER_REPLICA = 4
MAX_WEIGHTS_GIB = 1_000_000


class FitSpec(_Model):
    """How much GPU memory the model needs, so each GPU product is checked before it gets a
    pool: fits in one node, needs a group of nodes (LeaderWorkerSet), or gets no pool."""

    weights_gib: float = Field(
        ...,
        alias="weightsGiB",
        gt=0,
        le=MAX_WEIGHTS_GIB,
        description="GiB (2^30 bytes) the model's weights take in GPU memory, over all GPUs "
        "of a replica (e.g. DeepSeek-V3 FP8: ~652 GiB; a 27B model in BF16: ~51 GiB).",
    )
    headroom: float = Field(
        DEFAULT_FIT_HEADROOM,
        ge=0,
        le=0.9,
        description="Share of each GPU's memory kept free of weights for the KV cache and "
        "activations: weights may fill at most (1 - headroom) of it.",
    )
    max_nodes_per_replica: int = Field(
        DEFAULT_MAX_NODES_PER_REPLICA,
        ge=1,
        le=64,
        description="The most nodes one replica may span; a product that would need more "
        "gets no pool.",
    )


_CEL_SPEC = [
    {
        "rule": "!has(self.speculative) || !has(self.speculative.maxSpeculativeTokens) || "
        "type(self.speculative.numSpeculativeTokens) == string || "
        "self.speculative.numSpeculativeTokens <= self.speculative.maxSpeculativeTokens",
        "message": "speculative.numSpeculativeTokens must not exceed "
        "speculative.maxSpeculativeTokens",
        "fieldPath": ".speculative.numSpeculativeTokens",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.speculative) || !has(self.speculative.mtpLayers) || "
        "type(self.speculative.numSpeculativeTokens) == string || "
        "self.speculative.numSpeculativeTokens <= self.speculative.mtpLayers || "
        "self.speculative.numSpeculativeTokens % self.speculative.mtpLayers == 0",
        "message": "speculative.numSpeculativeTokens above speculative.mtpLayers must be a "
        "multiple of it (vLLM runs the model's MTP layers in whole rounds)",
        "fieldPath": ".speculative.numSpeculativeTokens",
        "reason": "FieldValueInvalid",
    },
]


class MTPInferenceSpec(_Model):
    model: str = Field(
        ...,
        min_length=1,
        pattern=MODEL_ID_PATTERN,
        description="Model to serve (Hugging Face or ModelScope id, or a path): letters, digits "
        "and `-_./:@+`, not starting with `-`.",
    )
    served_model_name: str | None = Field(
        None,
        pattern=MODEL_ID_PATTERN,
        description="Name the OpenAI API serves the model under (the same characters as model).",
    )
    model_source: Literal["huggingface", "modelscope"] = Field(
        "huggingface", description="`modelscope` sets VLLM_USE_MODELSCOPE=true."
    )
    image: str | None = Field(
        None, description="Runtime image; default from the operator's settings."
    )
    replicas: int = Field(1, ge=0, le=INT32_MAX, description="Replicas per GPU pool.")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs per replica.")
    max_model_len: int | str | None = Field(
        None, description="Context length: an integer, or vLLM's forms such as `32k`/`auto`."
    )
    reasoning_parser: str | None = Field(None, description="vLLM reasoning parser, e.g. `qwen3`.")
    gpu_products: list[Annotated[str, Field(min_length=1, max_length=253)]] | None = Field(
        None,
        max_length=64,
        description="Allow-list of `nvidia.com/gpu.product` values; default: every GPU product "
        "on schedulable nodes that fit a replica.",
    )
    node_selector: dict[str, str] | None = Field(
        None, description="Extra node selector for every pool."
    )
    tolerations: list[dict[str, Any]] | None = Field(
        None, max_length=MAX_TOLERATIONS, description="Pod tolerations."
    )
    host_network: bool = Field(
        False,
        description="Run the pool pods in the node's network namespace (ports 8000 and 9400 "
        "are then taken on the node: one replica per node), for clusters without a pod "
        "network.",
    )
    resources: dict[str, Any] | None = Field(
        None, description="Container resources; `nvidia.com/gpu` is set from tensorParallelSize."
    )
    env: list[dict[str, Any]] | None = Field(
        None, max_length=MAX_ENV, description="Extra container environment (EnvVar list)."
    )
    extra_args: list[Annotated[str, Field(max_length=MAX_EXTRA_ARG_LENGTH)]] | None = Field(
        None, max_length=128, description="Extra `vllm serve` arguments, appended last."
    )
    model_cache: ModelCacheSpec | None = Field(
        None,
        description="Where the pools keep the model's weights across restarts; default from "
        "the operator's settings (`modelCache.default`), else none.",
    )
    fit: FitSpec | None = Field(
        None,
        description="The model's GPU memory: each GPU product is checked against it (one "
        "node, a group of nodes, or no pool); unset: not checked, one node per replica.",
    )
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)  # type: ignore[arg-type]
    rollback: RollbackSpec = Field(default_factory=RollbackSpec)  # type: ignore[arg-type]
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)  # type: ignore[arg-type]


# ---- status -------------------------------------------------------------------------------

ConditionType = Literal["Ready", "Progressing", "Degraded", "SpeculationRolledBack"]


class Condition(_Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class PoolStatus(_Model):
    gpu_product: str
    num_speculative_tokens: int
    source: PoolSource
    reason: str = ""
    replicas: int = 0
    ready_replicas: int = 0
    deployment: str
    settings_hash: str = ""
    # Rollback state: kept in status so a restarted operator knows it.
    rollback_k: int | None = Field(
        None, description="K pinned by a rollback; cleared by a new spec generation or reset."
    )
    rollback_generation: int | None = None
    last_rollback_time: str | None = None
    known_good_k: int | None = Field(
        None, description="Last K that ran through the stabilization window without alerts."
    )
    settings_since: str | None = Field(None, description="When the running K was applied.")
    last_alert_time: str | None = None
    retained: str | None = Field(
        None,
        description="Why this pool is kept as it runs although no node fits it now: "
        "`NoSchedulableNode` (cordoned, NotReady, drained) or `ProductGone` (no node carries "
        "the product; removed after the operator's poolRemovalGraceSeconds).",
    )
    product_gone_since: str | None = Field(
        None, description="When no node carried this pool's GPU product any more."
    )
    tuning: PoolTuningStatus | None = Field(
        None, description="Measured K (spec.speculative.tuning)."
    )
    traffic_class: str | None = Field(
        None, description="The traffic class this pool serves (spec.speculative.classes)."
    )

    @property
    def key(self) -> str:
        """The pool's identity: the GPU product, or `product/class` (naming.pool_key)."""
        return self.gpu_product if self.traffic_class is None else (
            f"{self.gpu_product}/{self.traffic_class}"
        )
    nodes_per_replica: int | None = Field(
        None, description="Nodes one replica spans (a LeaderWorkerSet group when above 1)."
    )


FitVerdict = Literal["OneNode", "MultiNode", "DoesNotFit", "NotChecked"]


class ProductFit(_Model):
    """The fit check of one GPU product (spec.fit)."""

    gpu_product: str
    verdict: FitVerdict
    nodes_per_replica: int = 0
    gpus_per_node: int = 0
    gpu_memory_mib: int | None = None
    message: str = ""


class RollbackRecord(_Model):
    time: str
    gpu_product: str
    from_k: int
    to_k: int
    alert: str
    value: float | None = None
    threshold: float | None = None
    reason: str = ""
    via: Literal["alertmanager", "evaluator"] = "alertmanager"
    traffic_class: str | None = None  # the class pool rolled back (spec.speculative.classes)


class MTPInferenceStatus(_Model):
    observed_generation: int | None = None
    phase: Literal["Pending", "Progressing", "Ready", "Degraded", "Invalid"] | None = None
    conditions: list[Condition] = Field(default_factory=list)
    pools: list[PoolStatus] = Field(default_factory=list)
    rollbacks: list[RollbackRecord] = Field(default_factory=list)
    pools_summary: str | None = Field(None, description="Pools with their K, e.g. `H100:6 A100:4`.")
    tuning_summary: str | None = Field(
        None, description="Pools with the K tuning recommends, e.g. `H100:4 A100:4`."
    )
    ready: str | None = Field(None, description="Ready replicas over desired, over all pools.")
    rollback_reset_token: str | None = Field(
        None, description="The last `mtp-operator.io/reset-rollback` annotation value acted on."
    )
    fit: list[ProductFit] = Field(
        default_factory=list, description="Per GPU product: does the model fit (spec.fit)."
    )
    fit_summary: str | None = Field(
        None,
        description="Nodes per replica by product (`H200:1 H100:2 L40S:no`), or `not checked` "
        "without spec.fit.",
    )
    removed_pools: list[str] = Field(
        default_factory=list, description="GPU products whose pools were removed, most recent last."
    )


class MTPInference(_Model):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )
    api_version: Literal["mtp-operator.io/v1alpha1"] = "mtp-operator.io/v1alpha1"
    kind: Literal["MTPInference"] = "MTPInference"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: MTPInferenceSpec
    status: MTPInferenceStatus | None = None


SPEC_CEL_RULES = _CEL_SPEC + TUNING_CEL
