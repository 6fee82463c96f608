"""MTPInference v1alpha1, the model cache: `spec.modelCache` (and the operator's default).

Field names are the public contract (camelCase on the wire). Which cache applies and what it
adds to the pool pods is `mtp_operator.model_cache`; these are only the shapes and their CEL.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from mtp_operator.api.base import Model as _Model

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
