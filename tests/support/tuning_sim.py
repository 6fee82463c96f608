"""A pool from first principles, for the tuner's unit tests: what vLLM's counters would read.

Traffic: every request has one prefill step (one token) and then decode steps; a draft of K
tokens has its first j+1 tokens accepted with probability `prefix[j]` (non-increasing), so a
decode step emits 1 + Σ_{j<K} prefix[j] tokens on average. Cost: a replica spends `cost(K)`
seconds per request-step at the load. Counters are the expected values (no sampling noise
unless `noise` multiplies the step cost). This is an independent derivation of the figures the
estimator reads: the estimator never sees `prefix` or `cost`, only the counters.

Load: closed (the default) keeps `concurrency` requests in every replica, so a faster K emits
more; open (`arrival_rate` requests/s sent to each replica, as a Service sends every pod the
same rate) below a replica's capacity emits exactly what it is sent at any K, and a faster K
shows only in a request's time in the engine: an engine step takes `cost(K)·concurrency`
seconds whatever the batch below `concurrency` (a GPU reading its weights once a step), so a
request takes `steps_per_request·cost(K)·concurrency` seconds and the mean batch is the rate
times that (Little's law). At or over capacity an open replica runs as a closed one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mtp_operator.tuning.counters import WindowCounters
from mtp_runtime.spec_decode import SpecCounters


@dataclass(frozen=True)
class SimPool:
    prefix: Sequence[float]  # P(first j+1 draft tokens accepted), j = 0..
    cost: Callable[[int], float]  # seconds per request-step at K
    tokens_per_request: float = 128.0
    concurrency: float = 4.0
    arrival_rate: float | None = None  # requests/s per replica (open load); None: closed

    def steps_per_request(self, k: int) -> float:
        return 1 + (self.tokens_per_request - 1) / self.tau(k)

    def request_seconds(self, k: int, noise: float = 1.0) -> float:
        """A request's time in the engine at K below capacity (open load)."""
        return self.steps_per_request(k) * self.cost(k) * noise * self.concurrency

    def tau(self, k: int) -> float:
        return 1.0 + sum(self.prefix[:k])

    def true_tps(self, k: int) -> float:
        """Output tokens/s of one replica at K, from the traffic and the cost directly."""
        per_request_steps = 1 + (self.tokens_per_request - 1) / self.tau(k)
        return self.tokens_per_request / (per_request_steps * self.cost(k))

    def window(
        self, k: int, start: float, seconds: float, replicas: int = 1, noise: float = 1.0
    ) -> WindowCounters:
        """The counters of `replicas` replicas at K over `seconds` (cost scaled by noise)."""
        steps_per_request = self.steps_per_request(k)
        requests = seconds * replicas / (steps_per_request * self.cost(k) * noise)
        busy = self.concurrency  # requests in the engine at any moment (closed load)
        if self.arrival_rate is not None:
            w = self.request_seconds(k, noise)
            if self.arrival_rate * w < self.concurrency:  # below capacity
                requests = self.arrival_rate * seconds * replicas
                busy = self.arrival_rate * w
        decode_steps = requests * (self.tokens_per_request - 1) / self.tau(k)
        per_pos = tuple(decode_steps * p for p in self.prefix[:k])
        spec = (
            SpecCounters(decode_steps, decode_steps * k, sum(per_pos), per_pos)
            if k
            else SpecCounters()
        )
        gen = requests * self.tokens_per_request
        n = requests * steps_per_request
        if busy < self.concurrency:  # open load: the batch as vLLM's gauge reads it
            return WindowCounters(k, start, start + seconds, replicas, spec, gen, None, busy,
                                  busy * seconds * replicas, gen)
        return WindowCounters(
            k, start, start + seconds, replicas, spec, gen, n / self.concurrency, None,
            busy * seconds * replicas, gen,
        )


def linear_cost(alpha: float, beta: float, k0: float | None = None) -> Callable[[int], float]:
    """alpha + beta·K for K ≥ 1; K = 0 costs `k0` (default alpha: no separate drafter cost)."""
    return lambda k: (alpha if k0 is None else k0) if k == 0 else alpha + beta * k


def drive(
    sim: SimPool,
    start_k: int,
    policy,
    replicas: int = 2,
    windows: int = 20,
    noise: Callable[[int], float] = lambda i: 1.0,
    t0=None,
    switch_at: int | None = None,
    then: SimPool | None = None,
    prior=None,
):
    """Run the tuner's decision on a simulated pool, one observation window at a time.

    Returns (K of the pool after each window, trials started, decisions). A canary trial runs
    one replica at the trial K beside the others over the same window; a whole-pool trial runs
    every replica at it. From window `switch_at` on, the traffic and cost are `then`'s.
    """
    from datetime import UTC, datetime, timedelta

    from mtp_operator.tuning.decision import Guard, Trial, decide_tuning
    from mtp_operator.tuning.estimator import measure

    t0 = t0 or datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    span = policy.observation_seconds
    k, trial, history, table = start_k, None, [], []
    ks, trials, decisions = [], [], []
    for i in range(windows):
        start = t0.timestamp() + i * span  # the table's times are epoch seconds, like now's
        now = t0 + timedelta(seconds=(i + 1) * span)
        if switch_at is not None and i == switch_at and then is not None:
            sim = then
        if trial is None:
            table.append(measure(sim.window(k, start, span, replicas, noise(i))))
        elif trial.kind == "canary":
            table.append(measure(sim.window(k, start, span, replicas - 1, noise(i))))
            table.append(measure(sim.window(trial.k, start, span, 1, noise(i))))
        else:
            table.append(measure(sim.window(trial.k, start, span, replicas, noise(i))))
        d = decide_tuning(policy, k, trial, history, table, Guard(), now, replicas, prior=prior)
        decisions.append(d)
        if d.action == "start_trial":
            trial = Trial(d.trial_k, k, now, d.trial_kind)
            trials.append(d.trial_k)
        elif d.action in ("adopt", "return", "abort"):
            outcome = {"adopt": "adopted", "return": "returned", "abort": "aborted"}[d.action]
            history.append(Trial(trial.k, trial.from_k, trial.started, trial.kind, now, outcome))
            trial = None
            k = d.k
        ks.append(k)
    return ks, trials, decisions
