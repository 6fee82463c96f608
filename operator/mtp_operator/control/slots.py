"""What the reconciler keeps per resource between passes, one small record per job:

- `Turn`: one pass at a time (the lock, a pass asked for while one runs, a pass scheduled
  for later, the last unexpected error);
- `Ours`: a write-through cache of our own writes (the status, the pools, the Service, the
  routing objects, the tuning canaries) until the watch shows them: a pass never plans with
  state older than what it wrote itself;
- `Memos`: the last pass's pure results (the parsed spec, the rendered objects, the typed
  status, drift verdicts), reused while their inputs are the same: most passes at scale are
  for a pool's status change and find the same spec and the same plans;
- `Seen`: the versions the last pass read (of the resource, its pools, the GPU nodes), so a
  watch event that brings nothing new makes no pass.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mtp_operator import builders
from mtp_operator.api.v1alpha1 import MTPInferenceSpec, MTPInferenceStatus
from mtp_operator.model_cache import effective
from mtp_operator.planning import PoolPlan
from mtp_operator.settings import OperatorSettings
from mtp_operator.validation import Problem, spec_problems


@dataclass(slots=True)
class Turn:
    """One pass of a resource at a time; a pass asked for while one runs runs once more."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dirty: bool = False  # a pass was asked for while the lock was held
    later: asyncio.TimerHandle | None = None  # a pass scheduled by reconcile_later()
    last_error: str | None = None  # the last unexpected error (its traceback is logged once)


@dataclass(slots=True)
class CanaryMemo:
    """A canary pod as the writer knows it (Ours.canaries, by pod name)."""

    product: str | None
    settings_hash: str | None
    applied_at: float  # monotonic: when made, or first shown by the watch
    seen: bool = False  # the watch has shown it
    deleted_at: float | None = None  # monotonic: when this operator deleted it


@dataclass(slots=True)
class Ours:
    """Our own writes, used until the watch delivers them (never plan with stale state)."""

    status: MTPInferenceStatus | None = None  # our last status write
    status_rv: int = 0  # its resourceVersion
    status_written: float = -1e9  # monotonic time of our last status write
    # Pools we applied, by pool key, until the watch delivers them: a pass that runs before
    # a new Deployment's watch event must not create (and announce) it a second time.
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)
    service_applied: float = -1e9  # monotonic time of our last Service apply
    service_seen: bool = False  # the watch has shown the Service since that apply
    # traffic classes: the routing objects applied, (kind, name) → their JSON
    routing: dict[tuple[str, str], str] = field(default_factory=dict)
    routing_set: Any = None  # the DesiredSet whose routing objects were all applied
    canaries: dict[str, CanaryMemo] = field(default_factory=dict)  # by pod name


@dataclass(slots=True)
class Memos:
    """The last pass's pure results, reused while their inputs are the same."""

    spec: tuple[str, Any, Any] | None = None  # (spec as JSON, spec, problems)
    # the spec object `spec` was last read from: a watch event brings a new body each time,
    # so the same object is the same spec (spec_of, the loops' read, compares no JSON then)
    spec_raw: Any = None
    desired: builders.DesiredSet | None = None  # the objects, rendered when needed
    # the watched body's status object and its typed reading: the evaluator and the tuner ask
    # for every resource's status each round, and a watch event brings a new object each
    # time (the models are frozen, so the reading can be shared)
    read: tuple[Any, MTPInferenceStatus] | None = None
    # per pool key: (desired objects, observed spec, drift.annotations_read of the observed
    # pool, drifted fields)
    drift: dict[str, tuple[Any, Any, Any, list[str]]] = field(default_factory=dict)

    def parsed_spec(
        self, body: Mapping[str, Any]
    ) -> tuple[MTPInferenceSpec | None, list[Problem]]:
        """spec_problems(spec), reused while the spec is the same (the one place the
        resource's spec is parsed: a pass, the alert path, the evaluator and the tuner)."""
        raw = body.get("spec") or {}
        text = json.dumps(raw, sort_keys=True, default=str)
        if self.spec is None or self.spec[0] != text:
            spec, problems = spec_problems(raw)
            self.spec = (text, spec, problems)
        self.spec_raw = raw
        return self.spec[1], list(self.spec[2] or [])

    def spec_of(
        self, body: Mapping[str, Any]
    ) -> tuple[MTPInferenceSpec | None, list[Problem]]:
        """parsed_spec() for the loops that read every resource each round (the evaluator,
        the tuner): the same spec object as last time is taken as read, without comparing
        its JSON; another object is compared (and parsed only when it differs)."""
        raw = body.get("spec")
        if self.spec is not None and raw is not None and raw is self.spec_raw:
            return self.spec[1], list(self.spec[2] or [])
        return self.parsed_spec(body)

    def desired_set(
        self, key: tuple[str, str], uid: str, spec: MTPInferenceSpec, plans: list[PoolPlan],
        settings: OperatorSettings, canaries: frozenset[str] = frozenset(),
    ) -> builders.DesiredSet:
        """builders.desired_objects (pure) as a DesiredSet, the same one while its inputs are
        the same (parsed_spec gave `spec`). The spec and each pool's K determine a plan's
        serve settings; the objects are never mutated."""
        assert self.spec is not None
        inputs = (
            self.spec[0],
            uid,
            tuple((p.key, p.k, p.source, p.k_mode, p.serve) for p in plans),
            canaries,
        )
        if self.desired is None or self.desired.inputs != inputs:
            self.desired = builders.DesiredSet(
                inputs, key[1], key[0], uid, spec, plans, settings.default_image,
                settings.gpu_profiles, effective(spec, settings.model_cache, key[0]), canaries,
            )
        return self.desired


@dataclass(slots=True)
class Seen:
    """What the last pass read: a watch event that shows nothing newer makes no pass."""

    # per pool key, the pool object: (resourceVersion, reconcile_plan.pool_inputs). A watch
    # event with the same version, or the same inputs, brings nothing new (at start-up every
    # pool's ADDED event would be a pass each)
    pools: dict[str, tuple[int, tuple[Any, ...]]] = field(default_factory=dict)
    # the resource's version and the GPU nodes' (Reconciler.nodes_seen): at start-up every
    # resource's listed event and the first node event would each make a pass of every
    # resource (2,000 passes for 1,000 resources), the second with nothing new
    resource_rv: int = -1
    nodes_version: int = -1


@dataclass(slots=True)
class Slot:
    """Everything kept of one resource between passes, by job."""

    turn: Turn = field(default_factory=Turn)
    ours: Ours = field(default_factory=Ours)
    memos: Memos = field(default_factory=Memos)
    seen: Seen = field(default_factory=Seen)

    def forget_our_pool(self, product: str) -> None:
        """Drop the pool object a write returned (the watch shows it now), and the drift memo
        entry that compared against it: when the watched copy brings no news, no pass
        replaces that entry, and it would keep the returned spec, a second copy of the pool
        (~10 KB), for as long as the pool is unchanged."""
        ours = self.ours.pools.pop(product)
        memo = self.memos.drift.get(product)
        if memo is not None and memo[1] is ours.get("spec"):
            del self.memos.drift[product]
