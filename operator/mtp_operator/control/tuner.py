"""The tuner's loop: scrape the pools of resources with `speculative.tuning`, close windows,
ask the pure decision, publish status and Events, and (Auto) start and end trials.

Every `interval` seconds it reads vLLM's /metrics on each Ready pod of each pool whose
resource has tuning on (the pods the built-in evaluator reads). Every `observationSeconds`
it closes a window per group of pods at one K (`tuning.counters`), adds the measurement to the
pool's table (memory only), and decides (`tuning.decision`). What it decides goes into
`status.pools[].tuning` through the reconciler's one way in (`Reconciler.fold_pass`, under
the resource's reconcile lock); that pass plans the pool with the tuned K (or a whole-pool
trial's K). The spec is never written.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from mtp_operator.adapters.scrape import MAX_PARALLEL_SCRAPES, fetch_pod_sample, tuner_timeout
from mtp_operator.api.v1alpha1 import PoolStatus
from mtp_operator.control.canary_room import canary_placement
from mtp_operator.control.ports import ClusterView, Kube, ReconcileCore
from mtp_operator.events import (
    REASON_CONCURRENCY_AT_CAPACITY,
    REASON_TUNING_ADOPTED,
    REASON_TUNING_FAILED,
    REASON_TUNING_RECOMMENDED,
    REASON_TUNING_TRIAL_ENDED,
    REASON_TUNING_TRIAL_STARTED,
)
from mtp_operator.naming import canary_pod_name
from mtp_operator.reconcile_plan import Fold
from mtp_operator.traffic_classes import class_specs
from mtp_operator.tuning.capacity import Capacity, window_capacity
from mtp_operator.tuning.counters import PodSample, pod_k, window_counters
from mtp_operator.tuning.decision import ThinWindows, Trial, decide_tuning
from mtp_operator.tuning.estimator import Measurement, measure, too_thin
from mtp_operator.tuning.priors import prior_for
from mtp_operator.tuning.schedule import recommend_schedule
from mtp_operator.tuning.settings import policy_for
from mtp_operator.tuning.state import (
    guard_from,
    published,
    stamped,
    trial_from,
    tuning_modes,
)
from mtp_runtime.gpu_profiles import is_hybrid

log = logging.getLogger(__name__)

MAX_TABLE = 32  # measurements kept per pool (status shows the latest 16)


@dataclass
class PoolMemory:
    """What the tuner remembers of one pool between ticks (not in status)."""

    generation: int | None = None
    window_start: float | None = None
    samples: dict[str, list[PodSample]] = field(default_factory=dict)  # by pod, this window
    table: list[Measurement] = field(default_factory=list)
    capacity: dict[int, Capacity] = field(default_factory=dict)  # last window's, by K
    at_capacity: bool = False  # the last window's verdict: an Event only when it turns true
    # by K: windows in a row whose pods were scraped throughout but too thin to measure, and
    # the last one's request-steps (a K missing from a window starts its count again)
    thin: dict[int, tuple[int, float]] = field(default_factory=dict)


class Tuner:
    def __init__(self, reconciler: ReconcileCore, view: ClusterView, kube: Kube) -> None:
        self.reconciler = reconciler
        self.view = view
        self.kube = kube
        self.pools: dict[tuple[str, str, str], PoolMemory] = {}

    async def tick(self, session: aiohttp.ClientSession, now: datetime) -> int:
        """One round; returns how many pools got a new decision."""
        if not getattr(self.view, "ready", True):
            return 0
        sem = asyncio.Semaphore(MAX_PARALLEL_SCRAPES)
        t = now.timestamp()
        seen: set[tuple[str, str, str]] = set()
        decided = 0
        for key in list(self.view.resource_keys()):
            body = self.view.resource(key)
            if body is None:
                continue
            spec, found = self.reconciler.spec_of(key, body)  # parsed once a spec
            if spec is None or found or all(m == "Off" for m in tuning_modes(spec)):
                continue
            generation = (body.get("metadata") or {}).get("generation")
            status = self.reconciler.current_status(key, body)
            specs = class_specs(spec)  # a class pool tunes with its class's spec
            for pool in status.pools:
                pool_spec = specs.get(pool.traffic_class or "", spec)
                if pool_spec.speculative.tuning.mode == "Off":
                    continue
                if (pool.nodes_per_replica or 1) > 1:
                    continue  # a LeaderWorkerSet pool: left alone, its status says why
                product = pool.key  # the pool key: `product/class` for a class pool
                ref = (key[0], key[1], product)
                seen.add(ref)
                mem = self.pools.setdefault(ref, PoolMemory(generation))
                if mem.generation != generation:  # a new spec: start over from it
                    self.pools[ref] = mem = PoolMemory(generation)
                pods = self.view.pool_pod_ips(key, product)
                samples = await asyncio.gather(
                    *(fetch_pod_sample(session, ip, sem, t) for ip in pods.values())
                )
                for name, sample in zip(pods, samples, strict=True):
                    if sample is not None:
                        mem.samples.setdefault(name, []).append(sample)
                if mem.window_start is None:
                    mem.window_start = t
                policy = policy_for(pool_spec)
                if t - mem.window_start < policy.observation_seconds:
                    continue
                self._close_window(mem, t)
                await self._decide(key, body, pool_spec, pool, mem, policy, generation, now)
                decided += 1
        for gone in set(self.pools) - seen:
            del self.pools[gone]
        return decided

    def _close_window(self, mem: PoolMemory, t: float) -> None:
        """Measure each group of pods that ran one K through the window (a pod's K is the
        number of draft positions its vLLM exports; a pod whose K changed is left out)."""
        start = mem.window_start or t
        groups: dict[int, dict[str, list[PodSample]]] = {}
        for name, samples in mem.samples.items():
            ks = {pod_k(s) for s in samples}
            if len(ks) == 1:
                groups.setdefault(ks.pop(), {})[name] = samples
        mem.capacity = {}
        thin: dict[int, tuple[int, float]] = {}
        for k, by_pod in sorted(groups.items()):
            cap = window_capacity(k, by_pod)
            if cap is not None:
                mem.capacity[k] = cap
            w = window_counters(k, by_pod, start, t)
            m = measure(w) if w is not None else None
            if m is not None:
                mem.table.append(m)
            elif w is not None and (steps := too_thin(w)) is not None:
                thin[k] = (mem.thin.get(k, (0, 0.0))[0] + 1, steps)
        mem.thin = thin
        mem.table = mem.table[-MAX_TABLE:]
        # the next window starts from each pod's last scrape; pods not seen now are dropped
        mem.samples = {p: s[-1:] for p, s in mem.samples.items() if s and s[-1].t >= t - 1e-6}
        mem.window_start = t

    async def _decide(
        self, key, body, spec, pool: PoolStatus, mem: PoolMemory, policy, generation,
        now: datetime,
    ) -> None:
        tuning = pool.tuning if pool.tuning and pool.tuning.generation == generation else None
        trial = trial_from(tuning.trial if tuning else None)
        history = [t for t in (trial_from(r) for r in (tuning.trials if tuning else [])) if t]
        tuned_k = tuning.tuned_k if tuning else None
        guard = guard_from(
            pool, spec.rollback.cooldown_seconds, now, float(spec.rollback.window_seconds)
        )
        running = trial.from_k if trial is not None else pool.num_speculative_tokens
        replicas = spec.replicas  # the pool's Deployment has one less while a canary runs
        hybrid = is_hybrid(spec.model, spec.speculative.method)
        cap = mem.capacity.get(running)
        thin = (ThinWindows(trial.k, *mem.thin[trial.k])
                if trial is not None and trial.k in mem.thin else None)
        d = decide_tuning(policy, running, trial, history, mem.table, guard, now, replicas,
                          prior=prior_for(pool.gpu_product, hybrid), capacity=cap, thin=thin)
        events: list[tuple[str, str, str]] = []
        product = pool.key
        ended_canary = None
        if d.action == "start_trial" and d.trial_k is not None and d.trial_kind is not None:
            if d.trial_kind == "canary":  # a spare slot, or one of the pool's replicas
                place = canary_placement(self.view, key, pool.key, pool.gpu_product, spec,
                                         pool.traffic_class)
                beside, cost = place.beside_pool, place.capacity_cost
            else:
                beside, cost = False, (f"all {replicas} replica(s) restart at K={d.trial_k}"
                                       " (a whole-pool trial)")
            trial = Trial(d.trial_k, running, now, d.trial_kind, beside_pool=beside,
                          capacity_cost=cost)
            events.append((REASON_TUNING_TRIAL_STARTED, f"pool {product}: {d.reason}; "
                           f"capacity cost: {cost}", "Normal"))
        elif d.action in ("adopt", "return", "abort") and trial is not None:
            outcome = {"adopt": "adopted", "return": "returned", "abort": "aborted"}[d.action]
            history.append(Trial(trial.k, trial.from_k, trial.started, trial.kind, now,
                                 outcome, d.reason, trial.beside_pool,  # type: ignore[arg-type]
                                 trial.capacity_cost))
            if d.action == "adopt":
                tuned_k = d.k
            if trial.kind == "canary":
                ended_canary = trial.k
            trial = None
            kind = REASON_TUNING_ADOPTED if d.action == "adopt" else REASON_TUNING_TRIAL_ENDED
            events.append((kind, f"pool {product}: {d.reason}",
                           "Warning" if d.action == "abort" else "Normal"))
        elif d.recommended_k is not None and d.recommended_k != (
                tuning.recommended_k if tuning else None):
            events.append((REASON_TUNING_RECOMMENDED, f"pool {product}: recommends K="
                           f"{d.recommended_k} (runs K={running}): {d.reason}", "Normal"))
        was, mem.at_capacity = mem.at_capacity, cap is not None and cap.at_capacity
        if cap is not None and cap.at_capacity and not was:
            events.append((REASON_CONCURRENCY_AT_CAPACITY, f"pool {product}: requests wait for "
                           f"KV space at {cap.describe()}; a lower K leaves room for more on "
                           "models whose per-request state grows with K", "Warning"))
        entry = published(policy.mode, d, mem.table, trial, history, tuned_k, generation, now,
                          recommend_schedule(mem.table), cap)
        entry = stamped(entry, tuning)  # unchanged but for the time: no status write
        failure: list[BaseException] = []

        async def fold() -> Fold:
            # one reconcile pass folds the entry into status (the one status writer), plans
            # the pool with it (tuned K, whole-pool trial, canary) and writes once
            return Fold(tuning={product: entry})

        async def then(error: BaseException | None) -> None:  # under the resource's lock
            if error is not None:
                failure.append(error)
                return
            for reason, message, type_ in events:
                await self.kube.event(body, reason, message, type_)
            if ended_canary is not None:  # the pool has its replica back: drop the canary
                await self.kube.delete_pod(key[0], canary_pod_name(
                    key[1], pool.gpu_product, ended_canary, pool.traffic_class))

        try:
            await self.reconciler.fold_pass(key, fold, then)
        except Exception:
            if not failure:  # not the pass's: raised as before
                raise
        if failure:  # this resource's failure is its own: the round goes on for the others
            # (issue 36); the pass's status says it too
            err = failure[0]
            log.warning("tuning %s/%s pool %s: %s", key[0], key[1], product, err)
            await self.kube.event(body, REASON_TUNING_FAILED, f"pool {product}: tuning's write "
                                  f"failed: {err}; retried next window", "Warning")


async def run_tuner(
    reconciler: ReconcileCore, view: ClusterView, kube: Kube, interval: float
) -> None:
    tuner = Tuner(reconciler, view, kube)
    async with aiohttp.ClientSession(timeout=tuner_timeout()) as session:
        while True:
            try:
                await tuner.tick(session, datetime.now(UTC))
            except Exception:  # keep tuning the other pools: one bad round must not stop it
                log.exception("tuning round failed")
            await asyncio.sleep(interval)
