"""What a pool is worth at a K: measurements from counters, a fitted step cost, estimates. Pure.

A **measurement** is one window of one group of replicas at one K (`counters.WindowCounters`):

- output tokens/s per replica      = G / (seconds · replicas)
- request-steps N                  = G - A: every emitted token is either an accepted draft
  token or the one token a request gets from each engine step it takes part in (the bonus
  token of a verification step, or the token of its prefill step)
- step cost u                      = seconds · replicas / N: a replica's seconds per
  request-step at the observed concurrency
- concurrency                      = N / S (request-steps per engine step, i.e. the mean batch)
  where vLLM exposes the engine step count S, else the mean of `num_requests_running`
- per-position acceptance a_j      = c_j / D, tokens per step τ = 1 + A / D (K = 0: τ = 1)
- request speed                    = output tokens of the requests that finished in the window
  over the seconds they spent in the engine (vLLM's e2e latency and generation-token
  histogram sums): what a request gets per second of its own time. Below saturation a
  replica's output is the request rate it is sent, whatever its K; its K shows in how long
  the requests take (`same_offered_load`)

**Tokens per step at a smaller K'**, exact from the counters of any window at K ≥ K': a draft
of K' tokens keeps the first K' of a K-token draft (the MTP chain proposes the same tokens), so
its accepted count is min(n, K') and τ(K') = 1 + Σ_{j<K'} a_j. Prefill steps emit one token at
every K; their share of the output p = (N - D) / G is the traffic's (one per request), so the
tokens per request-step at K' are r(K') = 1 / (p + (1 - p) / τ(K')) (= G / N at the measured K,
and 1 at K' = 0).

**Step cost per K** is fitted, never assumed: u(K) = alpha + beta·K by least squares over the pool's
own measurements at two or more K ≥ 1, with standard errors when there are more points than
parameters. K = 0 runs no drafter at all (on a small GPU model, K=1 measured 3x slower than
K=0 while K=3 was only 20 % slower than K=1: the drafter's fixed cost is no point on that
line), so u(0) is never extrapolated: it comes from a measurement at K = 0 or not at all.

Estimated output tokens/s at K' = r(K') / u(K'). Above the largest K measured the counters say
nothing; those estimates carry the basis "extrapolated" (acceptance beyond the last position
falling by the last measured ratio) and serve only to pick a trial, never to adopt a K.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from mtp_runtime.spec_decode import SpecCounters

from .counters import WindowCounters

MIN_REQUEST_STEPS = 50  # fewer in a window: no measurement (a trickle says nothing)


@dataclass(frozen=True)
class Measurement:
    """One row of the measured table."""

    k: int
    start: float
    end: float
    replicas: int
    output_tps: float  # per replica
    step_seconds: float  # u: seconds of one replica per request-step
    concurrency: float | None
    spec: SpecCounters  # increases (for exact tokens per step at smaller K)
    generation_tokens: float
    request_steps: float  # N = G - A
    request_seconds: float | None = None  # finished requests' seconds in the engine, summed
    request_tokens: float | None = None  # and their output tokens

    @property
    def request_speed(self) -> float | None:
        """Output tokens per second of request time of the requests that finished (None:
        not exposed, or none finished)."""
        if not self.request_seconds or self.request_tokens is None or self.request_seconds <= 0:
            return None
        return self.request_tokens / self.request_seconds

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def acceptance(self) -> tuple[float, ...]:
        d = self.spec.drafts
        return tuple(c / d for c in self.spec.per_position[: self.k]) if d > 0 else ()

    @property
    def tokens_per_step(self) -> float:
        return tokens_per_step(self.spec, self.k)

    @property
    def prefill_share(self) -> float:
        """p: the share of output tokens that came from steps without a draft."""
        if self.k == 0 or self.generation_tokens <= 0:
            return 0.0 if self.k else 1.0
        p = (self.request_steps - self.spec.drafts) / self.generation_tokens
        return min(max(p, 0.0), 1.0)


def measure(w: WindowCounters, min_request_steps: float = MIN_REQUEST_STEPS) -> Measurement | None:
    """A window's counters → a measurement; None when there is too little or mixed data.

    Mixed: drafts whose draft tokens are not K per draft (the window saw another K), or drafts
    at K = 0.
    """
    if w.k < 0 or w.seconds <= 0 or w.replicas <= 0:
        return None
    d, t = w.spec.drafts, w.spec.draft_tokens
    if w.k == 0 and d > 0:
        return None
    if w.k > 0 and (d <= 0 or abs(t - d * w.k) > 1e-6 * max(t, 1.0)):
        return None
    n = request_steps(w)
    if n < min_request_steps:
        return None
    steps_concurrency = n / w.engine_steps if w.engine_steps else None
    return Measurement(
        k=w.k,
        start=w.start,
        end=w.end,
        replicas=w.replicas,
        output_tps=w.generation_tokens / (w.seconds * w.replicas),
        step_seconds=w.seconds * w.replicas / n,
        concurrency=steps_concurrency if steps_concurrency is not None else w.running_mean,
        spec=w.spec,
        generation_tokens=w.generation_tokens,
        request_steps=n,
        request_seconds=w.request_seconds,
        request_tokens=w.request_tokens,
    )


def request_steps(w: WindowCounters) -> float:
    """The window's request-steps: N = G - A (one per request per engine step)."""
    return w.generation_tokens - w.spec.accepted


def too_thin(w: WindowCounters, min_request_steps: float = MIN_REQUEST_STEPS) -> float | None:
    """The window's request-steps when they are too few for `measure`; else None. What tells
    a trial whose pods serve but get too little of the traffic from one still loading the
    model."""
    n = request_steps(w)
    return n if n < min_request_steps else None


def tokens_per_step(spec: SpecCounters, k: int) -> float:
    """τ(K) = 1 + Σ_{j<K} c_j / D, exact for any K up to the K the counters ran at."""
    if k == 0:
        return 1.0
    if spec.drafts <= 0 or len(spec.per_position) < k:
        raise ValueError(f"counters of {len(spec.per_position)} positions cannot give K={k}")
    return 1.0 + sum(spec.per_position[:k]) / spec.drafts


def tokens_per_request_step(tau: float, prefill_share: float) -> float:
    """r = 1 / (p + (1 - p) / τ)."""
    return 1.0 / (prefill_share + (1.0 - prefill_share) / tau)


# ---- step cost ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostFit:
    """u(K) = alpha + beta·K over measurements at K ≥ 1."""

    alpha: float
    beta: float
    alpha_se: float | None  # None with as many points as parameters (an exact line)
    beta_se: float | None
    cov: float | None
    points: int
    ks: tuple[int, ...]
    rmse: float  # root mean square residual, seconds per request-step
    prior: str | None = None  # a prior's shape scaled to one K's windows (tuning/priors.py)

    def seconds(self, k: int) -> float:
        return self.alpha + self.beta * k

    def seconds_se(self, k: int) -> float | None:
        if self.alpha_se is None or self.beta_se is None or self.cov is None:
            return None
        var = self.alpha_se**2 + (k * self.beta_se) ** 2 + 2 * k * self.cov
        return math.sqrt(max(var, 0.0))

    def describe(self) -> str:
        ms = 1e3
        text = f"u(K) = {self.alpha * ms:.4g} ms + K x {self.beta * ms:.4g} ms"
        if self.alpha_se is not None and self.beta_se is not None:
            text += f" (+/- {self.alpha_se * ms:.2g}, {self.beta_se * ms:.2g})"
        ks = ",".join(str(k) for k in self.ks)
        if self.prior:
            return (f"{text} per request-step, {self.prior}, scaled to {self.points} windows "
                    f"at K={ks}")
        return f"{text} per request-step, {self.points} windows at K={ks}"


def fit_step_cost(measurements: Iterable[Measurement]) -> CostFit | None:
    """Least squares of step cost on K over the K ≥ 1 windows; None below two distinct K."""
    pts = [(float(m.k), m.step_seconds) for m in measurements if m.k >= 1]
    ks = sorted({int(k) for k, _ in pts})
    if len(ks) < 2:
        return None
    n = len(pts)
    mx = sum(k for k, _ in pts) / n
    my = sum(u for _, u in pts) / n
    sxx = sum((k - mx) ** 2 for k, _ in pts)
    sxy = sum((k - mx) * (u - my) for k, u in pts)
    beta = sxy / sxx
    alpha = my - beta * mx
    rss = sum((u - alpha - beta * k) ** 2 for k, u in pts)
    rmse = math.sqrt(rss / n)
    if n > 2:
        s2 = rss / (n - 2)
        beta_se = math.sqrt(s2 / sxx)
        alpha_se = math.sqrt(s2 * (1.0 / n + mx**2 / sxx))
        cov = -mx * s2 / sxx
    else:
        alpha_se = beta_se = cov = None
    return CostFit(alpha, beta, alpha_se, beta_se, cov, n, tuple(ks), rmse)


# ---- estimates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    k: int
    output_tps: float | None  # per replica; None: no basis
    uncertainty: float | None  # ± one standard error of output_tps, where known
    tokens_per_step: float | None  # τ(K) per draft step
    basis: str  # "measured", "counters", "extrapolated" or "none"
    detail: str  # the basis in words

    @property
    def adoptable(self) -> bool:
        return self.basis == "measured" and self.output_tps is not None


def pooled(ms: Sequence[Measurement]) -> Measurement:
    """Several windows at one K as one (counters summed)."""
    if len({m.k for m in ms}) != 1:
        raise ValueError("pooled() takes measurements at one K")
    spec = SpecCounters()
    for m in ms:
        spec = spec + m.spec
    gen = sum(m.generation_tokens for m in ms)
    n = sum(m.request_steps for m in ms)
    rs = sum(m.seconds * m.replicas for m in ms)
    conc = [m.concurrency for m in ms if m.concurrency is not None]
    req_s = [m.request_seconds for m in ms]
    req_t = [m.request_tokens for m in ms]
    return Measurement(
        ms[0].k,
        min(m.start for m in ms),
        max(m.end for m in ms),
        ms[-1].replicas,
        gen / rs,
        rs / n,
        sum(conc) / len(conc) if conc else None,
        spec,
        gen,
        n,
        None if None in req_s else sum(req_s),
        None if None in req_t else sum(req_t),
    )


def _mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


def _extrapolated_counts(src: Measurement, k: int) -> tuple[float, ...]:
    """c_j for j < k: the measured ones, then falling by the last measured ratio."""
    c = list(src.spec.per_position[: src.k])
    d = src.spec.drafts
    if src.k >= 2 and c[-2] > 0:
        q = c[-1] / c[-2]
    else:
        q = c[0] / d if d > 0 else 0.0
    while len(c) < k:
        c.append(c[-1] * q)
    return tuple(c)


def estimate(measurements: Sequence[Measurement], k: int, fit: CostFit | None) -> Estimate:
    """The estimate for one K from comparable measurements (see `estimates`)."""
    at_k = [m for m in measurements if m.k == k]
    if at_k:
        mean, se = _mean_se([m.output_tps for m in at_k])
        tau = pooled(at_k).tokens_per_step
        n = len(at_k)
        return Estimate(k, mean, se, tau, "measured", f"measured over {n} window(s)")
    if k == 0:
        return Estimate(k, None, None, 1.0, "none", "K=0 runs no drafter: needs a window at K=0")
    if fit is None:
        measured = sorted({m.k for m in measurements if m.k >= 1})
        return Estimate(
            k, None, None, _tau_or_none(measurements, k), "none",
            f"step cost known at K={measured or 'none'} only: needs windows at two K >= 1",
        )
    deeper = [m for m in measurements if m.k >= k]
    if deeper:
        top = max(m.k for m in deeper)
        src = pooled([m for m in deeper if m.k == top])
        tau = tokens_per_step(src.spec, k)
        basis, detail = "counters", f"tokens per step exact from the counters at K={top}"
    else:
        top = max(m.k for m in measurements if m.k >= 1)
        src = pooled([m for m in measurements if m.k == top])
        c = _extrapolated_counts(src, k)
        tau = 1.0 + sum(c) / src.spec.drafts
        basis = "extrapolated"
        detail = f"acceptance beyond position {top - 1} extrapolated from K={top}"
    u = fit.seconds(k)
    if u <= 0:
        return Estimate(k, None, None, tau, "none", f"step-cost line gives {u:.3g} s at K={k}")
    rho = tokens_per_request_step(tau, src.prefill_share)
    tps = rho / u
    u_se = fit.seconds_se(k)
    se = tps * u_se / u if u_se is not None else None
    return Estimate(k, tps, se, tau, basis, f"{detail}; {fit.describe()}")


def _tau_or_none(measurements: Sequence[Measurement], k: int) -> float | None:
    """τ(K) from the deepest windows that ran at least K, or None."""
    deeper = [m for m in measurements if m.k >= k]
    if not deeper:
        return None
    top = max(m.k for m in deeper)
    return tokens_per_step(pooled([m for m in deeper if m.k == top]).spec, k)


def estimates(
    measurements: Sequence[Measurement], candidates: Iterable[int],
    prior_fit: Callable[[Sequence[Measurement]], CostFit | None] | None = None,
) -> tuple[list[Estimate], CostFit | None]:
    """An estimate for every candidate K, and the step-cost fit they used.

    `measurements` must be comparable (same traffic and concurrency: `comparable()`). Without
    windows at two K >= 1, `prior_fit` (a measured GPU family's shape, tuning/priors.py) may
    give the fit.
    """
    fit = fit_step_cost(measurements)
    if fit is None and prior_fit is not None:
        fit = prior_fit(measurements)
    return [estimate(measurements, k, fit) for k in sorted(set(candidates))], fit


def comparable(
    a: Measurement, b: Measurement, concurrency_tolerance: float = 0.25, tau_tolerance: float = 0.1
) -> bool:
    """Whether two windows saw the same load and traffic, so their K can be compared.

    Same load: concurrency within `concurrency_tolerance` (relative; either unknown passes).
    Same traffic: tokens per step over the positions both ran (K = min of the two) within
    `tau_tolerance` relative (the first positions' acceptance is the traffic's signature).
    """
    if a.concurrency is not None and b.concurrency is not None:
        hi = max(a.concurrency, b.concurrency)
        if hi > 0 and abs(a.concurrency - b.concurrency) / hi > concurrency_tolerance:
            return False
    return same_traffic(a, b, tau_tolerance)


def same_traffic(a: Measurement, b: Measurement, tau_tolerance: float = 0.1) -> bool:
    """`comparable`'s traffic half: tokens per step over the positions both ran within
    `tau_tolerance` relative (K = 0 on either side: nothing to compare, passes)."""
    k = min(a.k, b.k)
    if k >= 1:
        ta, tb = tokens_per_step(a.spec, k), tokens_per_step(b.spec, k)
        if abs(ta - tb) / max(ta, tb) > tau_tolerance:
            return False
    return True


def better_on_less_load(trial: Measurement, incumbent: Measurement, min_gain: float) -> bool:
    """Whether a trial's window beat the incumbent's while running the smaller batch: the same
    traffic, a mean batch below the incumbent's and an output per replica at least `min_gain`
    above it. At a fixed K a replica's output grows with its batch, so at the incumbent's
    batch the trial would do at least as well: this verdict needs no equal load. Clients that
    wait for each answer (and a Service that sends each pod the same request rate) give a
    faster K exactly this: the same requests finish sooner, so fewer are in flight (on the
    real kubelet node every whole-pool trial of a K 27 % faster was returned as "load
    changed"). A trial with the larger batch and less output is simply worse; the two mixed
    cases need equal load (`comparable`)."""
    if trial.concurrency is None or incumbent.concurrency is None:
        return False
    return (trial.concurrency < incumbent.concurrency and same_traffic(trial, incumbent)
            and trial.output_tps >= incumbent.output_tps * (1 + min_gain))


OFFERED_LOAD_TOLERANCE = 0.15  # outputs per replica this close: the same request rate


def same_offered_load(
    trial: Measurement, incumbent: Measurement, tolerance: float = OFFERED_LOAD_TOLERANCE
) -> bool:
    """Whether two windows were sent the same work: the same traffic and outputs per replica
    within `tolerance` (relative), with request speeds known for both. Below saturation a
    replica emits what it is sent, so equal outputs say the request rate was equal whatever
    the K; the K then shows in the requests' time in the engine (Little's law: at one request
    rate the mean number in flight is the rate times the mean time), not in the output. A
    canary beside its pool, which the Service sends as many requests as every other pod, is
    this case: on the real kubelet node a canary of K=4 ran 20.5 tok/s at a mean batch of
    0.85 against its pool's 21.0 at 1.63 and was returned as "load changed". Compare such
    windows with `speed_ratio`."""
    if trial.request_speed is None or incumbent.request_speed is None:
        return False
    hi = max(trial.output_tps, incumbent.output_tps)
    if hi <= 0 or abs(trial.output_tps - incumbent.output_tps) / hi > tolerance:
        return False
    return same_traffic(trial, incumbent)


def speed_ratio(trial: Measurement, incumbent: Measurement) -> float:
    """The trial's request speed over the incumbent's: at the same request rate and traffic,
    the inverse ratio of the requests' mean times in the engine (`same_offered_load`)."""
    ts, inc = trial.request_speed, incumbent.request_speed
    if ts is None or inc is None:
        raise ValueError("request speed unknown")
    return ts / inc
