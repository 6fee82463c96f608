"""Draining a pool pod before vLLM stops: the decision and its loop. Pure: the clock, the
sleep and vLLM's load come in as arguments.

A pod that is leaving (a K change replaces every pool pod) must stop getting new requests
before it stops serving the ones it holds. The order, in `mtp-runtime drain` (the pod's
preStop) and again in `mtp-runtime serve` on SIGTERM:

1. readiness goes false (the runtime's `/ready` answers 503 once the drain marker exists), so
   the endpoint leaves the Service and gateways stop sending;
2. wait `SETTLE_S` at least, long enough for the endpoint's removal to reach the clients that
   follow it (requests already on their way still land here and are served);
3. wait until vLLM's `vllm:num_requests_running` and `vllm:num_requests_waiting` read 0 on
   `IDLE_READS` reads in a row, or until the drain timeout (`spec.rollout.drainSeconds`) has
   passed since the drain began;
4. only then is vLLM sent SIGTERM, with `--shutdown-timeout VLLM_SHUTDOWN_TIMEOUT_S`, so a
   request that still raced in is finished rather than aborted (vLLM 0.33's own drain: it
   finishes in-flight requests for that long, but aborts requests that arrive meanwhile and
   keeps `/health` at 200 throughout, so it cannot take the pod out of the endpoints by itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mtp_runtime import exposition

DRAIN_SECONDS_ENV = "MTP_RUNTIME_DRAIN_SECONDS"
STATE_DIR_ENV = "MTP_RUNTIME_STATE_DIR"
SETTLE_ENV = "MTP_RUNTIME_DRAIN_SETTLE_SECONDS"  # SETTLE_S unless set
DEFAULT_DRAIN_SECONDS = 120.0
SETTLE_S = 5.0  # the endpoint's removal reaching kube-proxy/gateways (readiness period 2 s)
IDLE_READS = 2  # reads of 0 in a row: one idle read between two requests is not idle
UNREACHABLE_READS = 3  # vLLM's /metrics not answering this often in a row: nothing to wait for
READ_INTERVAL_S = 1.0
# vLLM's own drain after ours (`--shutdown-timeout`): in-flight requests that raced in are
# finished, not aborted. The pod's terminationGracePeriodSeconds covers it (STOP_MARGIN_S).
VLLM_SHUTDOWN_TIMEOUT_S = 10
STOP_MARGIN_S = 30  # grace period = drain seconds + this (vLLM's drain and its teardown)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


@dataclass(frozen=True)
class Load:
    running: float
    waiting: float

    @property
    def idle(self) -> bool:
        return self.running + self.waiting == 0


def load_from_metrics(text: str) -> Load | None:
    """vLLM's running and waiting requests (summed over its series, e.g. engines), or None
    when its /metrics has neither gauge. Raises exposition.ParseError on bad text."""
    parsed = exposition.parse_exposition(text)
    running = parsed.family(RUNNING)
    waiting = parsed.family(WAITING)
    if not running and not waiting:
        return None
    return Load(running=sum(s.value for s in running), waiting=sum(s.value for s in waiting))


@dataclass(frozen=True)
class Step:
    done: bool
    reason: str  # idle | timeout | vllm_unreachable | settling | busy | unreachable


def decide(elapsed_s: float, timeout_s: float, load: Load | None, idle_reads: int,
           unreachable_reads: int, settle_s: float = SETTLE_S) -> Step:
    """One drain decision. `load`: the last read (None: vLLM's /metrics did not answer);
    `idle_reads`/`unreachable_reads`: how many reads in a row, this one included, were idle or
    unanswered. Timeout first: a drain never outlasts its budget."""
    if elapsed_s >= timeout_s:
        return Step(True, "timeout")
    if load is None and unreachable_reads >= UNREACHABLE_READS:
        return Step(True, "vllm_unreachable")
    if elapsed_s < settle_s:
        return Step(False, "settling")
    if load is None:
        return Step(False, "unreachable")
    if load.idle and idle_reads >= IDLE_READS:
        return Step(True, "idle")
    return Step(False, "busy")


@dataclass(frozen=True)
class Result:
    reason: str
    waited_s: float  # since this call began
    elapsed_s: float  # since the drain began (an earlier preStop's start counts)
    last: Load | None
    reads: int


def run(read_load: Callable[[], Load | None], now: Callable[[], float],
        sleep: Callable[[float], None], timeout_s: float, started_at: float,
        settle_s: float = SETTLE_S, interval_s: float = READ_INTERVAL_S) -> Result:
    """Read vLLM's load every `interval_s` until `decide` says done. `started_at` (same clock
    as `now`) is when the drain began, so the SIGTERM drain continues the preStop's budget."""
    begun = now()
    idle = unreachable = reads = 0
    while True:
        load = read_load()
        reads += 1
        idle = idle + 1 if load is not None and load.idle else 0
        unreachable = unreachable + 1 if load is None else 0
        t = now()
        step = decide(t - started_at, timeout_s, load, idle, unreachable, settle_s)
        if step.done:
            return Result(step.reason, t - begun, t - started_at, load, reads)
        sleep(max(0.0, min(interval_s, started_at + timeout_s - t)))


def parse_seconds(raw: str | None, where: str, default: float = DEFAULT_DRAIN_SECONDS
                  ) -> float:
    """Seconds from the environment: a finite number ≥ 0; ValueError naming `where`
    otherwise. Empty or None: `default`."""
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{where}={raw!r}: must be a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{where}={raw!r}: must be a finite number of seconds >= 0")
    return value
