"""MTPInference v1alpha1, measured K: `spec.speculative.tuning` and `status.pools[].tuning`.

Field names are the public contract (camelCase on the wire). How the tuner decides is
`mtp_operator.tuning`; these are only the shapes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from mtp_operator.api.base import Model as _Model
from mtp_runtime.vllm_command import MAX_SPECULATIVE_TOKENS

TuningMode = Literal["Off", "Recommend", "Auto"]
DEFAULT_MIN_GAIN = 0.05
DEFAULT_OBSERVATION_SECONDS = 300
DEFAULT_MAX_TRIALS_PER_DAY = 4
DEFAULT_TRIAL_WINDOWS = 3  # one window's noise can exceed minGain; the median of 3 cannot
DEFAULT_REVISIT_SECONDS = 21600  # 6 h: with the default 4 trials a day, at most 4 re-checks
MAX_TUNING_ROWS = 16  # measured table and estimates kept in status, per pool
MAX_TRIAL_HISTORY = 10
CanaryPlacement = Literal["SpareSlot", "FromPool"]
MAX_CAPACITY_COST_CHARS = 200


class TuningSpec(_Model):
    """Measured K: the operator measures each pool and finds the K with the most output."""

    mode: TuningMode = Field(
        "Off",
        description="`Off`; `Recommend`: measure, estimate and publish in status, change "
        "nothing; `Auto`: also try candidate K on the pool (a canary replica, or the whole "
        "pool when it has one replica) and adopt one that is at least minGain better.",
    )
    candidates: list[Annotated[int, Field(ge=0, le=MAX_SPECULATIVE_TOKENS)]] | None = Field(
        None,
        max_length=MAX_SPECULATIVE_TOKENS + 1,  # a set of the K 0..MAX_SPECULATIVE_TOKENS
        description=f"The K the tuner may try (0 = speculation off; at most "
        f"{MAX_SPECULATIVE_TOKENS}). Default: 0 up to speculative.maxSpeculativeTokens (6 "
        "without one), those vLLM accepts for mtpLayers.",
    )
    min_gain: float = Field(
        DEFAULT_MIN_GAIN,
        ge=0,
        le=1,
        description="Adopt or recommend another K only when its output tokens/s per replica is "
        "at least this much better (0.05 = 5 %).",
    )
    observation_seconds: int = Field(
        DEFAULT_OBSERVATION_SECONDS,
        ge=5,
        le=86400,
        description="The window of one measurement, and of one trial.",
    )
    max_trials_per_day: int = Field(
        DEFAULT_MAX_TRIALS_PER_DAY,
        ge=0,
        le=96,
        description="At most this many trials per pool in any 24 hours (Auto).",
    )
    trial_windows: int = Field(
        DEFAULT_TRIAL_WINDOWS,
        ge=1,
        le=12,
        description="A trial is judged on this many windows at its K: the median of its ratios "
        "to the incumbent over the same windows (canary) or to the incumbent's windows before "
        "the trial (whole pool) must reach minGain. Where the windows disagree (the median "
        "lies within its own standard error of minGain) the trial goes on, up to twice this "
        "many windows. More windows: slower trials, less noise.",
    )
    canary_placement: CanaryPlacement = Field(
        "SpareSlot",
        description="Where a canary (pools of 2 or more replicas) runs. `SpareSlot`: beside "
        "the full pool when the GPU product has a spare slot (GPUs no pool or canary of the "
        "operator requests), so the trial costs no serving capacity but uses one more pod's "
        "GPUs; without one, the pool gives a replica up for the trial. `FromPool`: always in "
        "one of the pool's own replicas (no GPU beyond the pool's). Decided when the trial "
        "starts and kept to its end (status trial.besidePool, trial.capacityCost).",
    )
    revisit_seconds: int = Field(
        DEFAULT_REVISIT_SECONDS,
        ge=0,
        le=604800,
        description="While a pool runs K=0 vLLM drafts nothing, so its windows cannot show "
        "that the traffic changed: windows at other K older than this stop counting and the "
        "tuner measures a K >= 1 again (one trial, within maxTrialsPerDay). 0: never.",
    )


class BatchSizeRange(_Model):
    """One entry of vLLM's `num_speculative_tokens_per_batch_size`: K for a batch-size range."""

    min_batch_size: int = Field(ge=1, description="First batch size of the range.")
    max_batch_size: int = Field(ge=1, description="Last batch size of the range (inclusive).")
    num_speculative_tokens: int = Field(
        ge=0,
        le=MAX_SPECULATIVE_TOKENS,
        description="K for these batch sizes (vLLM caps it at the pool's K).",
    )


# ---- status -------------------------------------------------------------------------------


class TuningMeasurement(_Model):
    """One window of replicas running one K."""

    k: int
    output_tokens_per_second: float = Field(description="Per replica.")
    concurrency: float | None = Field(None, description="Requests per engine step (mean batch).")
    request_tokens_per_second: float | None = Field(
        None,
        description="Output tokens per second of their own time in the engine, of the requests "
        "that finished in the window (vLLM's e2e latency); at the same request rate, below "
        "saturation, a faster K shows here and not in the output.",
    )
    acceptance: list[float] = Field(
        default_factory=list, description="Per draft position: accepted / drafts."
    )
    tokens_per_step: float = Field(description="1 + accepted / drafts (1 at K=0).")
    window_seconds: float
    window_end: str
    replicas: int


TuningBasis = Literal["measured", "counters", "extrapolated", "none"]


class TuningEstimate(_Model):
    k: int
    output_tokens_per_second: float | None = Field(None, description="Per replica; none: no basis.")
    uncertainty: float | None = Field(None, description="One standard error, where known.")
    tokens_per_step: float | None = None
    basis: TuningBasis = Field(
        description="`measured`: windows at this K; `counters`: tokens per step exact from a "
        "deeper K's counters, step cost from the fit; `extrapolated`: above every measured K; "
        "`none`: not enough measurements."
    )
    detail: str = ""


class PoolCapacity(_Model):
    """How close the pool ran to what its KV cache holds at its K, over the last window."""

    k: int = Field(description="The K the figures are for (the pool's running K).")
    peak_running: float = Field(description="Most requests one replica ran at once.")
    kv_cache_usage: float | None = Field(
        None, description="vLLM's KV-cache usage (0..1) at the fullest scrape.")
    estimated_capacity: float | None = Field(
        None, description="Requests of the window's mix one replica holds at this K "
        "(running / KV usage at the fullest scrape; absent under 10 % usage).")
    headroom: float | None = Field(
        None, description="estimatedCapacity - peakRunning: requests more that would fit.")
    waiting_for_capacity: float = Field(
        0, description="Most requests waiting for KV space at one scrape (above 0: the "
        "pool's concurrency ran into what K leaves room for).")


class StepCost(_Model):
    """The fitted step cost u(K) = baseSeconds + K * perTokenSeconds (K >= 1)."""

    model: str
    base_seconds: float
    per_token_seconds: float
    base_seconds_error: float | None = None
    per_token_seconds_error: float | None = None
    windows: int
    ks: list[int]
    rmse_seconds: float


class TuningTrial(_Model):
    k: int
    from_k: int
    kind: Literal["canary", "pool"]
    beside_pool: bool = Field(
        False, description="A canary on a spare slot beside the full pool (no replica given "
        "up); false: the pool runs one replica less for the trial (or, kind pool, all of it "
        "restarts at the trial's K).")
    capacity_cost: str = Field(
        "", max_length=MAX_CAPACITY_COST_CHARS,
        description="What the trial costs in serving capacity, with the numbers it was "
        "decided on.")
    started: str
    ended: str | None = None
    outcome: Literal["adopted", "returned", "aborted", "superseded"] | None = Field(
        None, description="superseded: a spec change (a new generation) ended the trial.")
    reason: str = ""


class PoolTuningStatus(_Model):
    mode: TuningMode
    recommended_k: int | None = None
    reason: str = ""
    measured: list[TuningMeasurement] = Field(default_factory=list, max_length=MAX_TUNING_ROWS)
    estimates: list[TuningEstimate] = Field(default_factory=list, max_length=MAX_TUNING_ROWS)
    step_cost: StepCost | None = None
    capacity: PoolCapacity | None = Field(
        None, description="KV capacity at the running K over the last window.")
    recommended_schedule: list[BatchSizeRange] | None = Field(
        None,
        description="When windows at different concurrencies have different best measured "
        "K: a speculative.batchSizeSchedule that gives each load its K.",
    )
    trial: TuningTrial | None = Field(None, description="The trial running now.")
    trials: list[TuningTrial] = Field(
        default_factory=list, max_length=MAX_TRIAL_HISTORY, description="Ended trials."
    )
    tuned_k: int | None = Field(None, description="K adopted by tuning (pool source `tuned`).")
    generation: int | None = Field(
        None,
        description="The spec generation this state is for: a new generation starts tuning "
        "over from the spec's K.",
    )
    updated: str | None = None


TUNING_CEL = [
    {
        "rule": "!has(self.speculative) || !has(self.speculative.tuning) || "
        "!has(self.speculative.tuning.candidates) || "
        "!has(self.speculative.maxSpeculativeTokens) || "
        "self.speculative.tuning.candidates.all(k, k <= self.speculative.maxSpeculativeTokens)",
        "message": "speculative.tuning.candidates must not exceed "
        "speculative.maxSpeculativeTokens",
        "fieldPath": ".speculative.tuning.candidates",
        "reason": "FieldValueInvalid",
    },
]
