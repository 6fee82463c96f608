"""MTPInference v1alpha1: the single source of truth for the CRD (crds/ is generated from here).

Field names are the public contract. Python attributes are snake_case; the wire format is
camelCase. Rules the API server can check live in the schema (bounds, enums) and in CEL
(`x-kubernetes-validations`); rules that need the cluster or vLLM's own logic are checked by
the operator (see validation.py) and reported with the same kind of message.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

# The spec's and status's parts live beside this module (rollback.py, cache.py,
# resource_status.py, tuning.py, classes.py); the names below are re-exported, so
# `mtp_operator.api.v1alpha1` still names every model and constant of the resource.
from mtp_operator.api.base import INT32_MAX as INT32_MAX
from mtp_operator.api.base import Model as _Model
from mtp_operator.api.cache import HOST_PATH_CEL as HOST_PATH_CEL
from mtp_operator.api.cache import MODEL_CACHE_CEL as MODEL_CACHE_CEL
from mtp_operator.api.cache import MODEL_CACHE_MOUNT_PATH as MODEL_CACHE_MOUNT_PATH
from mtp_operator.api.cache import MODEL_CACHE_ONE_OF as MODEL_CACHE_ONE_OF
from mtp_operator.api.cache import MODEL_CACHE_READ_ONLY as MODEL_CACHE_READ_ONLY
from mtp_operator.api.cache import ClaimCache as ClaimCache
from mtp_operator.api.cache import HostPathCache as HostPathCache
from mtp_operator.api.cache import ModelCacheSpec as ModelCacheSpec
from mtp_operator.api.cache import NoCache as NoCache
from mtp_operator.api.classes import MAX_CLASSES, TrafficClass
from mtp_operator.api.resource_status import Condition as Condition
from mtp_operator.api.resource_status import ConditionType as ConditionType
from mtp_operator.api.resource_status import FitVerdict as FitVerdict
from mtp_operator.api.resource_status import MTPInferenceStatus as MTPInferenceStatus
from mtp_operator.api.resource_status import PoolStatus as PoolStatus
from mtp_operator.api.resource_status import ProductFit as ProductFit
from mtp_operator.api.resource_status import RollbackRecord as RollbackRecord
from mtp_operator.api.rollback import ALERT_ERROR_PROPAGATION_HIGH as ALERT_ERROR_PROPAGATION_HIGH
from mtp_operator.api.rollback import ALERT_HIT_RATE_LOW as ALERT_HIT_RATE_LOW
from mtp_operator.api.rollback import (
    DEFAULT_MAX_ERROR_PROPAGATION_RATE as DEFAULT_MAX_ERROR_PROPAGATION_RATE,
)
from mtp_operator.api.rollback import DEFAULT_MIN_HIT_RATE as DEFAULT_MIN_HIT_RATE
from mtp_operator.api.rollback import LABEL_NAME_PATTERN as LABEL_NAME_PATTERN
from mtp_operator.api.rollback import (
    MAX_ALERT_MATCHER_VALUE_LENGTH as MAX_ALERT_MATCHER_VALUE_LENGTH,
)
from mtp_operator.api.rollback import MAX_ALERT_MATCHERS as MAX_ALERT_MATCHERS
from mtp_operator.api.rollback import MAX_DURATION_SECONDS as MAX_DURATION_SECONDS
from mtp_operator.api.rollback import MAX_ROLLBACK_HISTORY as MAX_ROLLBACK_HISTORY
from mtp_operator.api.rollback import ROLLBACK_ALERT_NAMES as ROLLBACK_ALERT_NAMES
from mtp_operator.api.rollback import RollbackAlertName as RollbackAlertName
from mtp_operator.api.rollback import RollbackSpec as RollbackSpec
from mtp_operator.api.tuning import TUNING_CEL, BatchSizeRange, TuningSpec
from mtp_runtime.drain import DRAIN_SECONDS_ENV
from mtp_runtime.gpu_profiles import PoolSource as PoolSource
from mtp_runtime.model_cache import CACHE_ROOT_ENV
from mtp_runtime.pool_config import ENV_VAR
from mtp_runtime.vllm_command import MAX_SPECULATIVE_TOKENS, MODEL_ID_PATTERN

GROUP = "mtp-operator.io"
VERSION = "v1alpha1"
KIND = "MTPInference"
PLURAL = "mtpinferences"
SINGULAR = "mtpinference"
SHORT_NAMES = ["mtpi"]

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


# ---- the resource -------------------------------------------------------------------------


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
