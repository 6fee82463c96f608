"""Built-in evaluator: the shipped alerts' logic over scraped counters, for clusters without
Prometheus/Alertmanager. Pure: the caller scrapes the pool's pods, parses each exposition with
`mtp_runtime.spec_decode.spec_snapshot`, and passes the snapshots and `now` in.

The figures come from mtp_runtime.figures (the same maths as the runtime's exporter and the
recording rules). Per pool and alert, like a Prometheus alerting rule:

- fewer than minDrafts drafts in the window (or no window yet) is no data: nothing pending,
  and an alert that was firing resolves (with value None, which the policy never acts on);
- a threshold (the resource's own) crossed continuously for forSeconds fires: a firing
  AlertSignal on the first crossing past forSeconds and again every `repeat_seconds` while it
  lasts (the policy's cooldown decides whether a repeat acts), a resolved one when it ends;
- a change of the pool's K starts over: old counters do not describe the new settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from mtp_runtime.figures import CounterWindow, Figures, figures_from_increase
from mtp_runtime.spec_decode import SeriesKey, Snapshot, SpecCounters

from ..api.v1alpha1 import RollbackSpec
from .policy import crosses, resource_threshold
from .signals import ERROR_PROPAGATION_HIGH, HIT_RATE_LOW, AlertSignal, PoolRef

# alert → the key of mtp_runtime.figures.figures() it watches
WATCHED = {HIT_RATE_LOW: "hit_rate", ERROR_PROPAGATION_HIGH: "error_propagation_rate"}
DEFAULT_REPEAT_SECONDS = 60.0


def pool_snapshot(per_pod: Mapping[str, Snapshot]) -> dict[SeriesKey, SpecCounters]:
    """One snapshot of a pool from each pod's spec_snapshot(), keys made unique per pod."""
    out: dict[SeriesKey, SpecCounters] = {}
    for pod, snapshot in per_pod.items():
        for key, counters in snapshot.items():
            out[(("pod", pod), *key)] = counters
    return out


@dataclass
class Evaluation:
    signals: list[AlertSignal]
    figures: Figures  # over the window
    no_data: bool


@dataclass
class PoolEvaluator:
    """The evaluator's memory of one pool. Feed it every scrape with `observe()`."""

    target: PoolRef
    repeat_seconds: float = DEFAULT_REPEAT_SECONDS
    k: int | None = None
    window: CounterWindow = field(default_factory=CounterWindow)
    pending_since: dict[str, datetime] = field(default_factory=dict)
    last_fired: dict[str, datetime] = field(default_factory=dict)  # firing alerts → last sent
    # last counters of every series seen, so a pod missing from one scrape (a failed scrape)
    # is not counted from zero when it comes back
    _last_seen: dict[SeriesKey, tuple[float, SpecCounters]] = field(default_factory=dict)

    def reset(self) -> None:
        self.window = CounterWindow(self.window.span_s)
        self.pending_since.clear()
        self.last_fired.clear()
        self._last_seen.clear()

    def _filled(self, t: float, snapshot: Snapshot) -> dict[SeriesKey, SpecCounters]:
        for key, counters in snapshot.items():
            self._last_seen[key] = (t, counters)
        horizon = t - self.window.span_s
        for key in [k for k, (seen, _) in self._last_seen.items() if seen < horizon]:
            del self._last_seen[key]
        return {key: counters for key, (_, counters) in self._last_seen.items()}

    def _signal(
        self, alert: str, status: str, value: float | None, spec: RollbackSpec, now: datetime
    ) -> AlertSignal:
        return AlertSignal(
            alert=alert,
            status=status,  # type: ignore[arg-type]
            target=self.target,
            value=value,
            threshold=resource_threshold(alert, spec),
            via="evaluator",
            starts_at=self.pending_since.get(alert),
            ends_at=now if status == "resolved" else None,
        )

    def observe(
        self, now: datetime, snapshot: Snapshot, spec: RollbackSpec, k: int | None = None
    ) -> Evaluation:
        """Add one scrape of the pool (taken at `now`) and say which alerts fire or resolve.

        `k` is the K the pool runs now; a change of it starts the window over.
        """
        if k is not None and k != self.k:
            if self.k is not None:
                self.reset()
            self.k = k
        if self.window.span_s != spec.window_seconds:
            self.window.span_s = float(spec.window_seconds)
        t = now.timestamp()
        self.window.add(t, self._filled(t, snapshot))
        inc = self.window.increase(t)
        figures = figures_from_increase(inc if inc is not None else SpecCounters())
        no_data = inc is None or inc.drafts < spec.min_drafts

        signals: list[AlertSignal] = []
        for alert, key in WATCHED.items():
            raw = None if no_data else figures[key]
            value = float(raw) if isinstance(raw, int | float) else None
            if value is not None and crosses(alert, value, spec):
                since = self.pending_since.setdefault(alert, now)
                if now - since < timedelta(seconds=spec.for_seconds):
                    continue
                last = self.last_fired.get(alert)
                if last is None or now - last >= timedelta(seconds=self.repeat_seconds):
                    signals.append(self._signal(alert, "firing", value, spec, now))
                    self.last_fired[alert] = now
                continue
            if alert in self.last_fired:
                signals.append(self._signal(alert, "resolved", value, spec, now))
                del self.last_fired[alert]
            self.pending_since.pop(alert, None)
        return Evaluation(signals, figures, no_data)
