"""What a pool's speculative settings become when a rollback alert arrives. Pure: no I/O, and
`now` is always an argument.

Both alert sources (Alertmanager's webhook and the built-in evaluator) feed `decide_rollback()`:

1. Only MTPHitRateLow / MTPErrorPropagationHigh act; a resolved alert changes no K (it marks
   the alert's end in `last_alert_time`, which delays the known-good promotion).
2. No data (value missing or NaN) never rolls back.
3. The value is checked against the resource's own thresholds (RollbackSpec): the shipped
   rules fire at the defaults, so a resource that sets a looser threshold is left alone.
4. A firing alert over the resource's threshold is recorded in `last_alert_time` even when
   nothing else happens: the running settings are not good.
5. Disabled, within cooldownSeconds of the last rollback, or K already 0: no change.
6. Otherwise: back to the pool's known-good K when that is lower than the current K (a
   higher known-good K would answer an alert by speculating more), else one step down to the
   next K the model's MTP depth allows (6→5→4→…, with mtpLayers=2: 6→4→2→1→0); 0 is off.

Known-good (hysteresis): the running K becomes known-good once it has run stabilizationSeconds
since it was applied and since the last alert (`promote_known_good`). K=0 never does (it emits
no spec-decode metrics, so "no alert" proves nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from mtp_runtime.gpu_profiles import valid_k_for_depth

from ..api.v1alpha1 import PoolStatus, RollbackRecord, RollbackSpec
from ..naming import pool_key, split_pool_key
from ..timestamps import format_time, parse_time
from .signals import ERROR_PROPAGATION_HIGH, HIT_RATE_LOW, ROLLBACK_ALERTS, AlertSignal


@dataclass(frozen=True)
class PoolRollbackState:
    """One pool's speculative settings and rollback memory (kept in status.pools[])."""

    gpu_product: str  # the pool key: the GPU product, or `product/class` (naming.pool_key)
    current_k: int  # what the pool runs now
    spec_k: int  # what the spec/profile asks for without a rollback
    mtp_layers: int | None = None
    known_good_k: int | None = None
    settings_since: datetime | None = None  # when current_k was applied
    last_rollback_time: datetime | None = None
    last_alert_time: datetime | None = None
    rollback_k: int | None = None  # K pinned by a rollback; None = follow the spec
    rollback_generation: int | None = None

    @classmethod
    def from_pool_status(
        cls,
        pool: PoolStatus | Mapping[str, Any],
        spec_k: int,
        mtp_layers: int | None = None,
    ) -> PoolRollbackState:
        """From a status pool entry (the pydantic model or its camelCase dict; other keys of
        the dict are ignored)."""
        p = pool.model_dump(by_alias=True) if isinstance(pool, PoolStatus) else pool
        return cls(
            gpu_product=pool_key(p["gpuProduct"], p.get("trafficClass")),
            current_k=int(p.get("numSpeculativeTokens") or 0),
            spec_k=spec_k,
            mtp_layers=mtp_layers,
            known_good_k=p.get("knownGoodK"),
            settings_since=parse_time(p.get("settingsSince")),
            last_rollback_time=parse_time(p.get("lastRollbackTime")),
            last_alert_time=parse_time(p.get("lastAlertTime")),
            rollback_k=p.get("rollbackK"),
            rollback_generation=p.get("rollbackGeneration"),
        )

    def status_fields(self) -> dict[str, Any]:
        """The rollback fields of a status pool entry, camelCase, times as RFC 3339."""

        def t(x: datetime | None) -> str | None:
            return format_time(x) if x else None

        return {
            "rollbackK": self.rollback_k,
            "rollbackGeneration": self.rollback_generation,
            "lastRollbackTime": t(self.last_rollback_time),
            "knownGoodK": self.known_good_k,
            "settingsSince": t(self.settings_since),
            "lastAlertTime": t(self.last_alert_time),
        }


@dataclass(frozen=True)
class RollbackDecision:
    """The outcome of one signal. Write `state` back even when `new_k` is None (alert times)."""

    new_k: int | None  # None: no change; 0: speculation off
    reason: str
    state: PoolRollbackState
    record: RollbackRecord | None = None  # for status.rollbacks, when new_k is not None

    @property
    def changed(self) -> bool:
        return self.new_k is not None


def next_lower_k(k: int, mtp_layers: int | None) -> int:
    """The largest K below `k` that vLLM accepts for this MTP depth (0 = off)."""
    for lower in range(k - 1, 0, -1):
        if valid_k_for_depth(lower, mtp_layers):
            return lower
    return 0


def resource_threshold(alert: str, spec: RollbackSpec) -> float:
    return spec.min_hit_rate if alert == HIT_RATE_LOW else spec.max_error_propagation_rate


def crosses(alert: str, value: float, spec: RollbackSpec) -> bool:
    """Whether `value` is unhealthy by the resource's own threshold for this alert."""
    if alert == HIT_RATE_LOW:
        return value < spec.min_hit_rate
    if alert == ERROR_PROPAGATION_HIGH:
        return value > spec.max_error_propagation_rate
    return False


def _no_change(state: PoolRollbackState, reason: str) -> RollbackDecision:
    return RollbackDecision(None, reason, state)


def shown(value: float, threshold: float) -> str:
    """`value` with 4 significant digits, or as many more as it takes not to look equal to
    the threshold (0.87999 against 0.88 reads `0.87999`, never `0.88 < 0.88`)."""
    for digits in range(4, 18):
        text = f"{value:.{digits}g}"
        if value == threshold or text != f"{threshold:g}":
            return text
    return repr(value)


def _later(a: datetime | None, b: datetime) -> datetime:
    return b if a is None or b > a else a


def decide_rollback(
    state: PoolRollbackState,
    signal: AlertSignal,
    spec: RollbackSpec,
    now: datetime,
    generation: int | None = None,
) -> RollbackDecision:
    """The pool's new settings after `signal` (see the module doc for the rules).

    `generation` is the resource's metadata.generation; a rollback is pinned to it so that a
    new spec generation undoes it (see `effective_k`).
    """
    alert = signal.alert
    if alert not in ROLLBACK_ALERTS:
        return _no_change(state, f"{alert} is not a rollback alert")
    if signal.status == "resolved":
        ended = min(signal.ends_at, now) if signal.ends_at else now
        return _no_change(
            replace(state, last_alert_time=_later(state.last_alert_time, ended)),
            f"{alert} resolved",
        )
    if not signal.has_value:
        return _no_change(state, f"{alert} carries no value (no data): never rolled back")
    value = float(signal.value)  # type: ignore[arg-type]
    threshold = resource_threshold(alert, spec)
    if not 0.0 <= value <= 1.0:
        return _no_change(state, f"{alert} value {value!r} is outside [0, 1]: impossible, ignored")
    if not crosses(alert, value, spec):
        return _no_change(
            state,
            f"{alert} value {shown(value, threshold)} is within this resource's threshold "
            f"{threshold:g}",
        )

    state = replace(state, last_alert_time=_later(state.last_alert_time, now))
    if not spec.enabled:
        return _no_change(state, "rollback disabled (spec.rollback.enabled=false)")
    if state.last_rollback_time is not None:
        until = state.last_rollback_time + timedelta(seconds=spec.cooldown_seconds)
        if now < until:
            return _no_change(state, f"in cooldown until {format_time(until)}")
    k = state.current_k
    if k <= 0:
        return _no_change(state, "speculation already off")

    good = state.known_good_k
    if good is not None and 0 < good < k and valid_k_for_depth(good, state.mtp_layers):
        to_k, how = good, f"restored known-good K={good}"
    else:
        to_k = next_lower_k(k, state.mtp_layers)
        how = f"stepped K down {k}->{to_k}" + (" (speculation off)" if to_k == 0 else "")
    cmp = "<" if alert == HIT_RATE_LOW else ">"
    reason = f"{alert} {shown(value, threshold)} {cmp} {threshold:g}: {how}"
    new_state = replace(
        state,
        current_k=to_k,
        rollback_k=to_k,
        rollback_generation=generation,
        last_rollback_time=now,
        settings_since=now,
    )
    product, traffic_class = split_pool_key(state.gpu_product)
    record = RollbackRecord(
        time=format_time(now),
        gpu_product=product,
        traffic_class=traffic_class,
        from_k=k,
        to_k=to_k,
        alert=alert,
        value=value,
        threshold=threshold,
        reason=reason,
        via=signal.via,
    )
    return RollbackDecision(to_k, reason, new_state, record)


# spec.rollback.alertNames / alertMatchers refused a signal (counted by the webhook in
# mtp_operator_alerts_ignored_total{reason})
NOT_ALLOWED_BY_RESOURCE = "not_allowed_by_resource"


def allowed_by_resource(spec: RollbackSpec, signal: AlertSignal) -> bool:
    """Whether the resource lets `signal` act at all (firing or resolved). `alertNames`
    names the rules, which the built-in evaluator runs too, so it applies to both sources;
    `alertMatchers` are matched against a webhook alert's labels only (the evaluator's
    signals carry none and come from the operator itself, not from a token holder). A
    matcher `label: ""` matches an alert without the label, as in Prometheus."""
    if signal.alert not in spec.alert_names:
        return False
    if signal.via != "alertmanager" or not spec.alert_matchers:
        return True
    return all(signal.labels.get(k, "") == v for k, v in spec.alert_matchers.items())


def known_good_due(state: PoolRollbackState, spec: RollbackSpec) -> datetime | None:
    """When the running K becomes known-good if no alert comes first (None: never/unknown)."""
    if state.current_k <= 0 or state.settings_since is None:
        return None
    quiet_since = _later(state.last_alert_time, state.settings_since)
    return quiet_since + timedelta(seconds=spec.stabilization_seconds)


def promote_known_good(
    state: PoolRollbackState, now: datetime, spec: RollbackSpec
) -> PoolRollbackState:
    """The state with the running K as known-good once it has been quiet long enough."""
    due = known_good_due(state, spec)
    if due is None or now < due or state.known_good_k == state.current_k:
        return state
    return replace(state, known_good_k=state.current_k)


# ---- undoing a rollback ---------------------------------------------------------------------


@dataclass(frozen=True)
class EffectiveK:
    k: int
    source: Literal["spec", "rollback"]
    rollback_k: int | None  # the pin to keep in status (None: cleared or none)
    handled_reset_token: str | None  # the reset annotation value to keep as handled
    reason: str


def is_new_reset_token(token: str | None, handled: str | None) -> bool:
    """The reset rule, in one place: an annotation value undoes a pin only once, when it
    differs from the last value acted on (`status.rollbackResetToken`)."""
    return bool(token) and token != handled


def handled_reset_token_after(token: str | None, handled: str | None) -> str | None:
    """The value to keep as handled after this pass: a new token is marked handled even
    when nothing was pinned, so an old token cannot undo a later rollback."""
    return token if is_new_reset_token(token, handled) else handled


def effective_k(
    spec_k: int,
    rollback_k: int | None,
    rollback_generation: int | None,
    generation: int | None,
    reset_token: str | None = None,
    handled_reset_token: str | None = None,
) -> EffectiveK:
    """The K a pool runs: the spec's, or a rollback's pin while that still holds.

    A pin is undone by a new spec generation (the user changed the spec: their word wins) or
    by a new value of the `mtp-operator.io/reset-rollback` annotation. A new token is marked
    handled even when nothing is pinned, so an old token cannot undo a later rollback. A pin
    never raises K above what the spec now asks for.
    """
    new_token = is_new_reset_token(reset_token, handled_reset_token)
    handled = handled_reset_token_after(reset_token, handled_reset_token)
    if rollback_k is None:
        return EffectiveK(spec_k, "spec", None, handled, "no rollback")
    if rollback_generation != generation:
        return EffectiveK(
            spec_k,
            "spec",
            None,
            handled,
            f"rollback undone: spec generation {rollback_generation} -> {generation}",
        )
    if new_token:
        return EffectiveK(
            spec_k, "spec", None, handled, f"rollback undone by reset annotation {reset_token!r}"
        )
    k = min(rollback_k, spec_k)
    return EffectiveK(k, "rollback", rollback_k, handled, f"pinned by rollback to K={rollback_k}")
