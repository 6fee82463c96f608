"""Operator-wide settings: the defaults a resource does not set itself.

Read from a YAML file (the chart mounts it from a ConfigMap) and overridden by CLI flags:
    defaultImage: ghcr.io/mtp-operator/mtp-runtime:0.1.0
    gpuProfiles: {NVIDIA-H100-80GB-HBM3: 5, L40S: 1}   # cluster-wide K overrides
    evaluator: {enabled: true, intervalSeconds: 15}
    modelCache:                                        # for resources without spec.modelCache
      default: {persistentVolumeClaim: {claimName: model-cache}}
      allowedHostPaths: [/var/lib/mtp-models]          # folders hostPath caches may use
      shareHostPathAcrossNamespaces: false   # true: hostPath caches not keyed by namespace
    poolRemovalGraceSeconds: 600   # a pool whose GPU product no node carries goes after this
    listPageSize: 100              # objects per page when the operator lists a kind at start
    alerts:
      maxAlertAgeSeconds: 10800      # webhook alerts that began longer ago are ignored
      requireNamespaceOptIn: true    # the webhook acts only in namespaces labelled
                                     # mtp-operator.io/alert-rollback=enabled
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from mtp_operator import __version__
from mtp_operator.api.v1alpha1 import ModelCacheSpec

DEFAULT_RUNTIME_IMAGE = f"ghcr.io/mtp-operator/mtp-runtime:{__version__}"
DEFAULT_POOL_REMOVAL_GRACE_SECONDS = 600.0
# a page is parsed whole and held until its last object is handed on: 500 pool pods with their
# managedFields were ~40 MB at once (bench, 1,000 resources); 100 keep that under ~10 MB
DEFAULT_LIST_PAGE_SIZE = 100
# A webhook alert that began (firing) or ended (resolved) longer ago than this is ignored
# (counted `stale`): a replayed or long-delayed notification is never obeyed. The bound must
# not cut short a pool that stays bad: Alertmanager repeats a firing alert with its first
# startsAt, and each repeat past the cooldown steps K once more. From the highest K (16,
# vllm_command.MAX_SPECULATIVE_TOKENS) to 0 is at most 16 steps one cooldown (600 s default)
# apart, the first after the rule's `for` (5 m): about 2 h 45 m, so 3 h. A resource with a
# longer cooldown needs a larger bound (or the alert to resolve and fire again).
DEFAULT_MAX_ALERT_AGE_SECONDS = 3 * 3600.0


class _Settings(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class EvaluatorSettings(_Settings):
    enabled: bool = True
    interval_seconds: float = Field(15.0, gt=0)


class ModelCacheSettings(_Settings):
    # the cache of resources without spec.modelCache (None: no cache)
    default: ModelCacheSpec | None = None
    # hostPath caches must be these folders or below them; empty: no hostPath cache allowed
    allowed_host_paths: list[str] = Field(default_factory=list)
    # hostPath caches: each namespace has its own folder below the resource's path
    # (`<path>/<namespace>`), so one tenant cannot replace another's weights; true: one folder
    # for all namespaces (one copy of a model per node, every namespace trusted alike)
    share_host_path_across_namespaces: bool = False

    @field_validator("allowed_host_paths")
    @classmethod
    def _absolute(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/") or ".." in path.split("/"):
                raise ValueError(f"{path!r}: must be an absolute path without `..`")
        return paths


class AlertsSettings(_Settings):
    max_alert_age_seconds: float = Field(DEFAULT_MAX_ALERT_AGE_SECONDS, gt=0)
    # The webhook acts only on resources whose Namespace carries the label
    # mtp-operator.io/alert-rollback=enabled (adapters/namespaces.py); false: on any namespace
    # the operator watches. The built-in evaluator needs no opt-in.
    require_namespace_opt_in: bool = True


class OperatorSettings(_Settings):
    default_image: str = DEFAULT_RUNTIME_IMAGE
    gpu_profiles: dict[str, int] = Field(default_factory=dict)
    evaluator: EvaluatorSettings = Field(default_factory=EvaluatorSettings)
    model_cache: ModelCacheSettings = Field(default_factory=ModelCacheSettings)
    # A pool whose GPU product no node carries any more (label removed, node deleted, GPU
    # capacity 0) is kept this long before it is removed: a node being replaced or a GPU
    # driver/device-plugin restart must not cost a serving pool.
    pool_removal_grace_seconds: float = Field(DEFAULT_POOL_REMOVAL_GRACE_SECONDS, ge=0)
    # The watches' initial lists come in pages of this many objects (the API server's
    # `limit`): at thousands of pools one unpaged list is tens of MB of JSON parsed at once,
    # the operator's peak memory at every start.
    list_page_size: int = Field(DEFAULT_LIST_PAGE_SIZE, ge=1)
    # the Alertmanager webhook's bounds (DEFAULT_MAX_ALERT_AGE_SECONDS says why this default)
    alerts: AlertsSettings = Field(default_factory=AlertsSettings)


class SettingsFileError(ValueError):
    pass


def load_settings(path: str | Path | None) -> OperatorSettings:
    if path is None:
        return OperatorSettings()
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
        return OperatorSettings.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as err:
        raise SettingsFileError(f"settings file {path}: {err}") from err
