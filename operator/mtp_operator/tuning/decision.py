"""What the tuner does next for one pool. Pure: measurements, state, rollback's view and `now`
in; a decision out. The caller applies it (restarts a canary, records a trial, writes status).

Rules, in order:

1. `Off`: nothing. A rollback always wins: while its alert fires, a rollback pin holds or its
   cooldown runs, no trial starts and a running trial ends ("aborted") at once.
2. The comparable table: windows whose load and traffic match the running K's latest window
   (`estimator.comparable`); older regimes are ignored, so a change of traffic starts the
   search again by itself. Every candidate gets an estimate (`estimator.estimates`).
   **K = 0 is blind to traffic**: with speculation off vLLM drafts nothing, so a window at
   K = 0 has no acceptance, the signature that tells one traffic from another. While the pool
   runs K = 0, windows at K >= 1 count only while the latest of them ended within
   `revisitSeconds` of the running window, and only those whose traffic matches that latest
   one; after that only K = 0 counts, so rule 5a measures a K >= 1 again (one trial: it is
   returned at once if the traffic is unchanged, and its window counts for another
   `revisitSeconds`; it is adopted if the traffic became predictable).
3. **Recommended K**: the best estimate (an extrapolated one only when it beats the best of
   the others by `minGain`), but only when it is at least `minGain` better than the running
   K's measured figure (hysteresis); else the running K.
4. A trial is judged once it has `trialWindows` full windows at its K, each paired with the
   incumbent (canary: the other replicas over the same window; whole pool: the incumbent's
   windows before the trial, latest first): the median of the pairs' ratios at least
   `minGain` above 1 → adopt, else return to the incumbent. One window's noise can exceed
   minGain on shared hardware (25 % was seen on two shared CPU cores); a median of three
   needs two of them to agree. The latest pair not comparable (load or traffic changed
   against the incumbent) → return at once; earlier pairs that are not comparable are left
   out. A pair whose trial window ran the smaller batch and still gave at least `minGain`
   more output per replica on the same traffic counts as comparable
   (`estimator.better_on_less_load`: a faster K under clients that wait for their answers
   runs fewer requests at once, and at equal batch it would do no worse). A pair sent the
   same work (same traffic, outputs per replica within 15 %: below saturation a replica emits
   what it is sent, at any K) is judged on the ratio of request speeds instead: output tokens
   per second of the finished requests' own time in the engine (`estimator.same_offered_load`;
   a canary beside its pool gets the same request rate as every pod, so its K shows only
   there). Such windows also count as one regime in rule 2. A trial that
   reaches its time-out with some but fewer windows is judged on those.
   **Not clear yet → more windows**: when the median lies closer to 1 + `minGain` than its
   own standard error (estimated from the windows' median absolute deviation), the windows
   disagree about which side of the threshold the trial is on, and the trial goes on, up to
   `TRIAL_EXTEND_FACTOR` times `trialWindows` windows (its time-out grows as much); then it is
   judged on the median of all of them. Where candidates lie within a window's noise of each
   other, three windows decide by luck (seen on real CPU engines: +25.2, +2.5 and -5.9 % for a
   K that the sweep put 10 % ahead).
5. `Auto` only, within `maxTrialsPerDay` (24 h sliding), not within one observation window
   of the last trial's end and only once a window at the incumbent K began after that end
   (the pool runs its K again: after a whole-pool trial that is a pod's start-up later), and
   only once every replica ran the incumbent K through the latest window (no rollout or start
   in progress): the next trial is the first of
   a. no K ≥ 1 measured: the deepest candidate (its counters give every smaller K's tokens
      per step);
   b. fewer than two K ≥ 1 measured: the candidate ≥ 1 farthest from the measured one (a
      second point for the step-cost line, as far as possible for a well-conditioned fit);
   c. the best untried estimate, if it beats the best measured K by `minGain`;
   d. K = 0 if untried: its step cost has no drafter in it and is never extrapolated.
   Before a-d: the recommended K, when it is measured in this regime but no trial of it
   ended there (`untried_recommendation`: windows of a trial cut short, or measured before
   the traffic changed); a-d only try unmeasured Ks, so it would otherwise never run.
   A K with a comparable measurement is never tried again in the same regime: every K is
   tried at most once per traffic regime, so K cannot oscillate. A K whose trial was aborted
   (a rollback, or no window at it within the pods' start-up allowance and three windows, or
   `trialWindows + 2` windows in a row whose pods served but too little to measure: `ThinWindows`)
   is not tried again within 24 h.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from mtp_operator.api.tuning import DEFAULT_REVISIT_SECONDS, DEFAULT_TRIAL_WINDOWS

from .capacity import Capacity
from .estimator import (
    MIN_REQUEST_STEPS,
    CostFit,
    Estimate,
    Measurement,
    better_on_less_load,
    comparable,
    estimates,
    same_offered_load,
    speed_ratio,
)
from .priors import CostPrior, prior_fit

Mode = Literal["Off", "Recommend", "Auto"]
TrialKind = Literal["canary", "pool"]
TrialOutcome = Literal["adopted", "returned", "aborted"]
Action = Literal["hold", "start_trial", "adopt", "return", "abort"]

DAY = timedelta(days=1)
TRIAL_TIMEOUT_WINDOWS = 3  # a trial short of windows this many windows late is aborted/judged
TRIAL_EXTEND_FACTOR = 2  # rule 4: a trial whose median is not clear of minGain goes on to this
# many times trialWindows windows
# for normally spread ratios the median's standard error is sqrt(pi/2) * sigma / sqrt(n) and the
# median absolute deviation is 0.6745 * sigma: so SE = (1.2533 / 0.6745) * MAD / sqrt(n)
MEDIAN_SE_PER_MAD = 1.2533 / 0.6745
STATUS_TIME_RESOLUTION = 1.0  # seconds: trial times come back from status as whole seconds


@dataclass(frozen=True)
class Policy:
    mode: Mode
    candidates: tuple[int, ...]
    min_gain: float = 0.05
    observation_seconds: float = 300.0
    max_trials_per_day: int = 4
    # how long a pod of the pool may take to start (its startup probe's budget): a trial's
    # pods load the model first, so its TRIAL_TIMEOUT_WINDOWS count from after that
    startup_seconds: float = 0.0
    # rule 2 at K = 0: windows at other K stop counting this long after the latest of them
    revisit_seconds: float = float(DEFAULT_REVISIT_SECONDS)
    # rule 4: windows at the trial's K that judge it (the median of their paired ratios)
    trial_windows: int = DEFAULT_TRIAL_WINDOWS


@dataclass(frozen=True)
class ThinWindows:
    """Windows in a row at one K whose pods were scraped throughout but held too few
    request-steps to be measured (`estimator.too_thin`): `windows` of them, the last with
    `request_steps`. A trial's pods that serve so little are up, so their time-out need not
    wait out the start-up allowance."""

    k: int
    windows: int
    request_steps: float


@dataclass(frozen=True)
class Trial:
    k: int
    from_k: int
    started: datetime
    kind: TrialKind
    ended: datetime | None = None
    outcome: TrialOutcome | None = None
    reason: str = ""
    beside_pool: bool = False  # a canary on a spare slot: the pool keeps every replica
    capacity_cost: str = ""  # what the trial costs in serving capacity (status)


@dataclass(frozen=True)
class Guard:
    """What rollback says about the pool now."""

    alert_firing: bool = False
    rollback_pinned: bool = False
    cooldown_until: datetime | None = None

    def blocks(self, now: datetime) -> str | None:
        if self.alert_firing:
            return "a rollback alert is firing"
        if self.rollback_pinned:
            return "a rollback pins this pool's K"
        if self.cooldown_until is not None and now < self.cooldown_until:
            return f"rollback cooldown until {self.cooldown_until.isoformat()}"
        return None


@dataclass(frozen=True)
class TuningDecision:
    action: Action
    k: int  # the incumbent K after this decision
    trial_k: int | None  # start_trial: the K to try
    trial_kind: TrialKind | None
    recommended_k: int | None
    reason: str
    estimates: tuple[Estimate, ...] = ()
    fit: CostFit | None = None


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def _latest(table: Sequence[Measurement], k: int, before: float | None = None):
    found = [m for m in table if m.k == k and (before is None or m.end <= before + 1e-9)]
    return max(found, key=lambda m: m.end) if found else None


def seen_at_k0(
    comp: Sequence[Measurement], current: Measurement, revisit_seconds: float
) -> list[Measurement]:
    """Rule 2 while the pool runs K = 0: the comparable windows that still count."""
    if current.k != 0 or revisit_seconds <= 0:
        return list(comp)
    drafted = [m for m in comp if m.k >= 1]
    if not drafted:
        return list(comp)
    anchor = max(drafted, key=lambda m: m.end)
    if current.end - anchor.end > revisit_seconds + 1e-9:
        return [m for m in comp if m.k == 0]
    return [m for m in comp if m.k == 0 or comparable(m, anchor)]


def recommend(
    ests: Sequence[Estimate], running_k: int, min_gain: float
) -> tuple[int | None, str]:
    """The recommended K with the reason in words (rule 3)."""
    by_k = {e.k: e for e in ests}
    here = by_k.get(running_k)
    if here is None or here.output_tps is None:
        return None, f"no window at the running K={running_k} yet"
    valued = [e for e in ests if e.output_tps is not None]
    known = [e for e in valued if e.basis != "extrapolated"]
    best = max(known, key=lambda e: (e.output_tps, -abs(e.k - running_k)))
    beyond = [e for e in valued if e.basis == "extrapolated"
              and (e.output_tps or 0.0) >= (best.output_tps or 0.0) * (1 + min_gain)]
    if beyond:  # above every measured K: only when clearly better than what is known
        best = max(beyond, key=lambda e: e.output_tps or 0.0)
    if best.k == running_k:
        return running_k, f"K={running_k} is the best known ({here.output_tps:.4g} tok/s/replica)"
    gain = best.output_tps / here.output_tps - 1
    if gain < min_gain:
        return running_k, (
            f"best other K={best.k} is {_pct(gain)} ({best.basis}): below minGain "
            f"{_pct(min_gain)}, K={running_k} stays"
        )
    return best.k, (
        f"K={best.k}: {best.output_tps:.4g} tok/s/replica ({best.basis}) vs "
        f"{here.output_tps:.4g} at K={running_k} ({_pct(gain)})"
    )


RETURNED = "returned: "  # the reason of a trial returned on its windows' verdict


def judged_in_regime(history: Sequence[Trial], running_k: int, since: float) -> frozenset[int]:
    """The Ks whose trial from `running_k` was returned on its windows' verdict (not for a
    change of load) since `since`, the oldest window of the running regime: tried once in this
    regime, not again. A canary's windows are paired with the pool's over the same minutes,
    when the Service splits the request rate over one pod more, so they rarely match the
    pool's later windows (on the real kubelet node a canary of K=4 returned at +0.1 % was
    tried again at once)."""
    return frozenset(t.k for t in history
                     if _returned_since(t, running_k, since) and t.reason.startswith(RETURNED))


def _returned_since(t: Trial, running_k: int, since: float) -> bool:
    """A trial from `running_k` that returned at or after `since` (epoch seconds)."""
    return (t.from_k == running_k and t.outcome == "returned" and t.ended is not None
            and t.ended.timestamp() >= since)


def refused_by_trial(
    history: Sequence[Trial], k: int, running_k: int, since: float
) -> Trial | None:
    """The latest trial of K from `running_k` that returned after `since` (the oldest window
    that still counts, epoch seconds): its paired windows already said K is not `minGain`
    better, and they outrank estimates from windows of different times. An aborted trial
    said nothing of K's worth."""
    lost = [t for t in history if t.k == k and _returned_since(t, running_k, since)]
    return max(lost, key=lambda t: t.ended) if lost else None  # type: ignore[arg-type,return-value]


def untried_recommendation(
    history: Sequence[Trial], comp: Sequence[Measurement], rec: int | None, running_k: int,
    skip: frozenset[int] = frozenset(),
) -> tuple[int | None, str]:
    """Rule 5's first choice: the recommended K when it has comparable windows but no trial
    of it ended while they count (its windows came from a trial cut short before its verdict,
    or it was measured beside another K before the traffic changed). Rules a-d only try
    unmeasured Ks, so such a K would stay recommended and never run (bench/results/
    tuning-run9.md: K=4 recommended at +50 % from the first window after a traffic switch,
    and the pool held K=1). Once per K and regime, like every trial: after its verdict the
    trial is in `history` (returned: `refused_by_trial` keeps it from being recommended)."""
    if rec is None or rec == running_k or rec in skip or not comp:
        return None, ""
    if not any(m.k == rec for m in comp):
        return None, ""
    since = min(m.start for m in comp)
    if any(t.k == rec and (t.ended or t.started).timestamp() >= since for t in history):
        return None, ""
    return rec, f"the recommended K={rec} is measured here but was never tried"


def next_trial(
    table: Sequence[Measurement], candidates: Sequence[int], ests: Sequence[Estimate],
    min_gain: float, skip: frozenset[int] = frozenset(), fit: CostFit | None = None,
) -> tuple[int | None, str]:
    """Rule 5's choice among the candidates without a comparable measurement (and not in
    `skip`: K whose trial was aborted in the last 24 h or returned on its verdict in this
    regime)."""
    measured = {m.k for m in table}
    untried = [k for k in sorted(set(candidates)) if k not in measured and k not in skip]
    if not untried:
        return None, "every candidate is measured"
    deep = [k for k in untried if k >= 1]
    measured1 = sorted(k for k in measured if k >= 1)
    if not measured1 and deep:
        return max(deep), "no acceptance measured yet: the deepest candidate's counters give " \
            "every smaller K's tokens per step"
    best_measured = max(
        (e.output_tps for e in ests if e.adoptable and e.output_tps is not None), default=None
    )
    tried_better = [
        e for e in ests
        if e.k in untried and e.output_tps is not None and best_measured is not None
        and e.output_tps >= best_measured * (1 + min_gain)
    ]
    if tried_better:  # with one K >= 1 measured, only a prior's fit gives such estimates
        e = max(tried_better, key=lambda e: e.output_tps or 0.0)
        gain = (e.output_tps or 0.0) / (best_measured or 1.0) - 1
        via = f"; {fit.prior}" if fit is not None and fit.prior else ""
        return e.k, f"estimated {_pct(gain)} over the best measured K ({e.basis}{via})"
    if len(measured1) < 2 and deep:
        ref = measured1[0]
        k = max(deep, key=lambda x: (abs(x - ref), -x))
        return k, f"a second K >= 1 for the step-cost fit (measured: K={ref})"
    if 0 in untried:
        return 0, "K=0 (no drafter) is only ever measured, never estimated"
    return None, "no untried candidate is estimated to beat the best measured K by minGain"


def _pairs(
    trial: Trial, table: Sequence[Measurement], need: int
) -> list[tuple[Measurement, Measurement]]:
    """Rule 4's pairs (trial window, incumbent window), oldest first. A whole-pool trial's
    windows, oldest first, take the incumbent's last `need` windows before the trial in turn
    (latest first): the tuner starts a trial after one window, so there is often only one to
    compare with. A window keeps its partner as later windows arrive."""
    started = trial.started.timestamp()
    at_k = sorted((m for m in table if m.k == trial.k and m.start >= started - 1e-9),
                  key=lambda m: m.end)
    if trial.kind == "canary":
        out = []
        for tm in at_k:
            same = [m for m in table if m.k == trial.from_k
                    and abs(m.end - tm.end) <= 0.05 * tm.seconds
                    and abs(m.start - tm.start) <= 0.05 * tm.seconds]
            if same:
                out.append((tm, same[-1]))
        return out
    # whole pool: status keeps times to the second, so "before" allows that much
    before = sorted((m for m in table if m.k == trial.from_k
                     and m.end <= started + STATUS_TIME_RESOLUTION + 1e-9),
                    key=lambda m: m.end, reverse=True)[:need]
    if not before:
        return []
    return [(tm, before[i % len(before)]) for i, tm in enumerate(at_k)]


def median_and_error(ratios: Sequence[float]) -> tuple[float, float]:
    """The median of a trial's paired ratios and its standard error, estimated robustly from
    the ratios' median absolute deviation (module doc, rule 4). One ratio: no error."""
    med = statistics.median(ratios)
    if len(ratios) < 2:
        return med, 0.0
    mad = statistics.median(abs(r - med) for r in ratios)
    return med, MEDIAN_SE_PER_MAD * mad / math.sqrt(len(ratios))


def _judge(
    policy: Policy, trial: Trial, table: Sequence[Measurement], now: datetime,
    thin: ThinWindows | None = None,
) -> TuningDecision:
    hold = TuningDecision("hold", trial.from_k, None, None, None, "")
    need = max(1, policy.trial_windows)
    most = TRIAL_EXTEND_FACTOR * need
    pairs = _pairs(trial, table, need)
    elapsed = (now - trial.started).total_seconds()

    def past(windows: int) -> bool:
        return elapsed > policy.startup_seconds + (
            TRIAL_TIMEOUT_WINDOWS + windows - 1) * policy.observation_seconds

    late = past(need)
    if not pairs:
        allowed = TRIAL_TIMEOUT_WINDOWS + need - 1  # windows past the start-up allowance
        thin = thin if thin is not None and thin.k == trial.k else None
        if thin is not None and thin.windows >= allowed:
            return TuningDecision(
                "abort", trial.from_k, None, None, None,
                f"trial of K={trial.k} got no full window: its pods served, but "
                f"{thin.windows} windows in a row held too few request-steps (the last "
                f"{thin.request_steps:.0f}; a window needs {MIN_REQUEST_STEPS}): a longer "
                f"observationSeconds than {policy.observation_seconds:.0f} s gives them enough",
            )
        if late:
            allowance = (f"{policy.startup_seconds:.0f} s of start-up and "
                         if policy.startup_seconds else "")
            return TuningDecision(
                "abort", trial.from_k, None, None, None,
                f"trial of K={trial.k} got no window in {allowance}{allowed} windows",
            )
        return _with(hold, f"trial of K={trial.k} ({trial.kind}) running, no full window yet"
                     + (f": its last window held {thin.request_steps:.0f} request-steps of the "
                        f"{MIN_REQUEST_STEPS} a window needs" if thin is not None else ""))
    def ratio(tm: Measurement, inc: Measurement) -> float | None:
        """The pair's ratio: request speed at the same request rate, else output per replica
        at the same load (or more output on less); None: the pair says nothing."""
        if same_offered_load(tm, inc):
            return speed_ratio(tm, inc)
        if comparable(tm, inc) or better_on_less_load(tm, inc, policy.min_gain):
            return tm.output_tps / inc.output_tps
        return None

    def judged(tm: Measurement, inc: Measurement) -> bool:
        return ratio(tm, inc) is not None

    if not judged(*pairs[-1]):
        return TuningDecision(
            "return", trial.from_k, None, None, None,
            f"trial of K={trial.k}: load or traffic changed against the incumbent's window",
        )
    if len(pairs) < need and not late:
        return _with(hold, f"trial of K={trial.k} ({trial.kind}): {len(pairs)} of {need} "
                           "windows")

    def verdict(n: int):
        kept = [(tm, inc) for tm, inc in pairs[:n] if judged(tm, inc)]
        ratios = [r for r in (ratio(tm, inc) for tm, inc in kept) if r is not None]
        med, err = median_and_error(ratios)
        return kept, ratios, med - 1, abs(med - 1 - policy.min_gain) >= err, err

    # the trial's first trialWindows windows; not clear of minGain: its first `most` windows
    # (the same verdict however late the tuner looks)
    kept, ratios, gain, clear, err = verdict(need)
    if not clear and len(pairs) > need:
        kept, ratios, gain, clear, err = verdict(most)
    each = ", ".join(_pct(r - 1) for r in ratios)
    if not clear and len(pairs) >= need and len(pairs) < most and not past(most):
        return _with(hold, f"trial of K={trial.k} ({trial.kind}): median {_pct(gain)} ± "
                           f"{_pct(err).lstrip('+')} over {len(kept)} windows ({each}) is not "
                           f"clear of minGain; up to {most} windows")
    tm, inc = kept[-1]
    where = "same window" if trial.kind == "canary" else "whole pool"
    if len(kept) == 1 and same_offered_load(tm, inc):
        words = (f"K={trial.k} {tm.request_speed:.4g} vs K={trial.from_k} "
                 f"{inc.request_speed:.4g} tok/s per request at the same request rate "
                 f"({tm.output_tps:.4g} vs {inc.output_tps:.4g} tok/s/replica; {_pct(gain)}, "
                 f"{where})")
    elif len(kept) == 1:
        words = (f"K={trial.k} {tm.output_tps:.4g} vs K={trial.from_k} {inc.output_tps:.4g} "
                 f"tok/s/replica ({_pct(gain)}, {where})")
    else:
        by_speed = sum(1 for tm_, inc_ in kept if same_offered_load(tm_, inc_))
        basis = (f"; {by_speed} by request speed at the same request rate" if by_speed
                 else "")
        words = (f"K={trial.k} vs K={trial.from_k}: median {_pct(gain)} over {len(kept)} "
                 f"windows ({each}; {where}{basis})")
    if gain >= policy.min_gain:
        return TuningDecision("adopt", trial.k, None, None, trial.k, f"adopted: {words}")
    return TuningDecision("return", trial.from_k, None, None, None, f"{RETURNED}{words}")


def _with(d: TuningDecision, reason: str) -> TuningDecision:
    return TuningDecision(d.action, d.k, d.trial_k, d.trial_kind, d.recommended_k, reason,
                    d.estimates, d.fit)


def decide_tuning(
    policy: Policy,
    running_k: int,
    trial: Trial | None,
    history: Sequence[Trial],
    table: Sequence[Measurement],
    guard: Guard,
    now: datetime,
    replicas: int,
    prior: CostPrior | None = None,
    capacity: Capacity | None = None,
    thin: ThinWindows | None = None,
) -> TuningDecision:
    """The next step for one pool (module doc). `running_k`: the incumbent K (outside a trial
    the pool's K; in a trial the K the trial returns to). `thin`: the too-thin windows in a
    row at the trial's K, if any."""
    if policy.mode == "Off":
        return TuningDecision("hold", running_k, None, None, None, "tuning is off")
    blocked = guard.blocks(now)
    if trial is not None and blocked:
        return TuningDecision("abort", trial.from_k, None, None, None,
                        f"trial of K={trial.k} ended: {blocked}")
    current = _latest(table, running_k)
    if trial is not None:
        verdict = _judge(policy, trial, table, now, thin)
        if verdict.action != "hold" or current is None:
            return verdict
    if current is None:
        return TuningDecision("hold", running_k, None, None, None,
                        f"measuring K={running_k}: no full window yet")
    # the same regime: the same load, or the same request rate (below saturation a K shows
    # in the requests' time, not in the batch or the output: `same_offered_load`)
    comp = seen_at_k0([m for m in table
                       if comparable(m, current) or same_offered_load(m, current)], current,
                      policy.revisit_seconds)
    cands = tuple(sorted(set(policy.candidates) | {running_k}))
    ests, fit = estimates(comp, cands,
                          (lambda ms: prior_fit(prior, ms)) if prior is not None else None)
    rec, why = recommend(ests, running_k, policy.min_gain)
    lost = (refused_by_trial(history, rec, running_k, min(m.start for m in comp))
            if rec is not None and rec != running_k and comp else None)
    if lost is not None:
        # the trial compared K with the incumbent over the same windows; the estimate compares
        # windows of different minutes, whose load differs (bench/results/tuning-run8.md:
        # +18.7 % across minutes against +4.4 % over the trial's 12 paired windows)
        why = (f"K={running_k} stays: K={lost.k}'s trial against it returned "
               f"({lost.reason or 'no reason recorded'}); across other windows it reads "
               f"{why}")
        rec = running_k
    base = TuningDecision("hold", running_k, None, None, rec, why, tuple(ests), fit)
    if trial is not None:  # still waiting for its window
        return _with(base, verdict.reason)
    if policy.mode == "Recommend":
        return base
    if blocked:
        return _with(base, f"{why}; no trial: {blocked}")
    if replicas < 1:
        return _with(base, f"{why}; no trial: no replicas")
    recent = [t for t in history if now - t.started < DAY]
    if len(recent) >= policy.max_trials_per_day:
        return _with(base, f"{why}; no trial: maxTrialsPerDay ({policy.max_trials_per_day}) used")
    last_end = max((t.ended for t in history if t.ended is not None), default=None)
    settle = timedelta(seconds=policy.observation_seconds)
    if last_end is not None and now - last_end < settle:
        return _with(base, f"{why}; settling after the last trial")
    if last_end is not None and current.start < last_end.timestamp() - STATUS_TIME_RESOLUTION:
        # a whole-pool trial's end restarts the pool at the incumbent K, which takes a pod's
        # start-up: a trial started before that keeps the pool at the trial's K, and its
        # windows meet only the incumbent's windows from before the first trial (seen on the
        # real kubelet node: 8 trials of K=4 in a row, each returned, the pool never at K=2)
        return _with(base, f"{why}; no trial: waiting for a window at K={running_k} that "
                           "began after the last trial ended")
    if current.replicas < replicas:
        # a rollout (an adoption's, a spec edit's) or a pod's start is still going on: a
        # canary now would take the slot the rollout's next pod needs, and its windows would
        # meet a pool still starting (seen on the real kubelet node: a canary started 5 min
        # into an adoption's rollout of 2 replicas)
        return _with(base, f"{why}; no trial: {current.replicas} of {replicas} replicas ran "
                           f"K={running_k} through the last window (a rollout or a start is "
                           "in progress)")
    # not tried now: aborted in the last 24 h, or returned on its verdict in this regime
    skip = frozenset(t.k for t in recent if t.outcome == "aborted")
    if comp:
        skip = skip | judged_in_regime(history, running_k, min(m.start for m in comp))
    full = capacity is not None and capacity.at_capacity and capacity.k == running_k
    if full:
        # requests already wait for KV space at this K; a deeper K holds no more of them (on
        # hybrid models fewer), and a trial's estimate knows nothing of capacity
        skip = skip | frozenset(k for k in policy.candidates if k > running_k)
    k, reason = untried_recommendation(history, comp, rec, running_k, skip)
    if k is None:
        k, reason = next_trial(comp, policy.candidates, ests, policy.min_gain, skip, fit)
    if full:
        reason = f"{reason} (no deeper K tried: at KV capacity, {capacity.describe()})"
    if k is None or k == running_k:
        return _with(base, f"{why}; {reason}")
    kind: TrialKind = "canary" if replicas >= 2 else "pool"
    return TuningDecision("start_trial", running_k, k, kind, rec, f"trial of K={k}: {reason}",
                    tuple(ests), fit)
