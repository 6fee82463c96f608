"""Rollback policy: pure decisions over a frozen clock (every time is passed in)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from mtp_operator.api.v1alpha1 import PoolStatus, RollbackRecord, RollbackSpec
from mtp_operator.rollback.policy import (
    PoolRollbackState,
    decide_rollback,
    effective_k,
    known_good_due,
    next_lower_k,
    promote_known_good,
)
from mtp_operator.rollback.signals import (
    ERROR_PROPAGATION_HIGH,
    HIT_RATE_LOW,
    AlertSignal,
    PoolRef,
)
from mtp_operator.timestamps import format_time, parse_time

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
POOL = PoolRef("ml", "dsv3", H100)
SPEC = RollbackSpec()  # cooldown 300 s, stabilization 600 s, thresholds 0.88 / 0.40


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def firing(
    alert: str = HIT_RATE_LOW, value: float | None = 0.7, via: str = "alertmanager"
) -> AlertSignal:
    threshold = 0.88 if alert == HIT_RATE_LOW else 0.4
    return AlertSignal(alert, "firing", POOL, value, threshold, via)  # type: ignore[arg-type]


def pool(k: int = 6, **kw: object) -> PoolRollbackState:
    return PoolRollbackState(H100, current_k=k, spec_k=k, settings_since=T0, **kw)  # type: ignore[arg-type]


def test_step_down_chain_to_off_then_nothing() -> None:
    state, t, seen = pool(6), 0.0, [6]
    for _ in range(6):
        t += SPEC.cooldown_seconds  # each alert comes just as the cooldown ends
        d = decide_rollback(state, firing(), SPEC, at(t), generation=3)
        assert d.changed
        state = d.state
        seen.append(d.new_k)
    assert seen == [6, 5, 4, 3, 2, 1, 0]
    assert state.rollback_k == 0 and state.rollback_generation == 3
    last = decide_rollback(state, firing(), SPEC, at(t + 10_000))
    assert not last.changed and last.reason == "speculation already off"


def test_rollback_record_and_state() -> None:
    d = decide_rollback(pool(6), firing(value=0.7), SPEC, at(60), generation=7)
    assert d.new_k == 5
    assert d.record == RollbackRecord(
        time="2026-11-29T12:01:00Z",
        gpu_product=H100,
        from_k=6,
        to_k=5,
        alert=HIT_RATE_LOW,
        value=0.7,
        threshold=0.88,
        reason="MTPHitRateLow 0.7 < 0.88: stepped K down 6->5",
        via="alertmanager",
    )
    s = d.state
    assert (s.current_k, s.rollback_k, s.rollback_generation) == (5, 5, 7)
    assert s.last_rollback_time == s.settings_since == s.last_alert_time == at(60)
    assert s.status_fields() == {
        "rollbackK": 5,
        "rollbackGeneration": 7,
        "lastRollbackTime": "2026-11-29T12:01:00Z",
        "knownGoodK": None,
        "settingsSince": "2026-11-29T12:01:00Z",
        "lastAlertTime": "2026-11-29T12:01:00Z",
    }


def test_error_propagation_alert_and_evaluator_source() -> None:
    d = decide_rollback(pool(6), firing(ERROR_PROPAGATION_HIGH, 0.55, via="evaluator"), SPEC, at(1))
    assert d.new_k == 5
    assert d.record is not None and d.record.via == "evaluator"
    assert d.record.reason == "MTPErrorPropagationHigh 0.55 > 0.4: stepped K down 6->5"


def test_known_good_restored_when_lower() -> None:
    d = decide_rollback(pool(6, known_good_k=3), firing(), SPEC, at(1))
    assert d.new_k == 3 and "restored known-good K=3" in d.reason
    # known-good equal to the current K (the running settings were good): step down instead
    d = decide_rollback(pool(6, known_good_k=6), firing(), SPEC, at(1))
    assert d.new_k == 5 and "stepped" in d.reason
    # a higher known-good K would answer an alert by speculating more: step down instead
    d = decide_rollback(pool(2, known_good_k=4), firing(), SPEC, at(1))
    assert d.new_k == 1
    # known-good is kept through the rollback
    assert d.state.known_good_k == 4


def test_known_good_invalid_for_the_depth_is_skipped() -> None:
    d = decide_rollback(pool(8, known_good_k=3, mtp_layers=2), firing(), SPEC, at(1))
    assert d.new_k == 6


def test_depth_rule_when_stepping_down() -> None:
    assert [next_lower_k(k, 2) for k in (6, 4, 2, 1)] == [4, 2, 1, 0]
    assert [next_lower_k(k, 3) for k in (9, 6, 3, 2, 1)] == [6, 3, 2, 1, 0]
    assert [next_lower_k(k, None) for k in (6, 1)] == [5, 0]
    state, chain = pool(6, mtp_layers=2), []
    for i in range(5):
        d = decide_rollback(state, firing(), SPEC, at(1000 * (i + 1)))
        state = d.state
        chain.append(d.new_k)
    assert chain == [4, 2, 1, 0, None]


def test_cooldown_and_duplicate_alerts() -> None:
    first = decide_rollback(pool(6), firing(), SPEC, at(100))
    assert first.new_k == 5
    # the same alert again (Alertmanager retry, HA pair, repeat): nothing twice
    for dt in (0, 1, 150, SPEC.cooldown_seconds - 1):
        d = decide_rollback(first.state, firing(), SPEC, at(100 + dt))
        until = format_time(at(100 + SPEC.cooldown_seconds))
        assert not d.changed and d.reason == f"in cooldown until {until}"
        assert d.state.current_k == 5
        assert d.state.last_alert_time == at(100 + dt)  # still counts against known-good
    # still firing once the cooldown is over: the new settings are bad too → next step
    d = decide_rollback(first.state, firing(), SPEC, at(100 + SPEC.cooldown_seconds))
    assert d.new_k == 4


def test_cooldown_zero_acts_on_every_firing_signal() -> None:
    spec = RollbackSpec(cooldown_seconds=0)
    d1 = decide_rollback(pool(6), firing(), spec, at(1))
    d2 = decide_rollback(d1.state, firing(), spec, at(1))
    assert (d1.new_k, d2.new_k) == (5, 4)


def test_resolved_changes_no_k_but_marks_the_alert_end() -> None:
    resolved = replace(firing(), status="resolved", ends_at=at(50))
    d = decide_rollback(pool(6), resolved, SPEC, at(80))
    assert not d.changed and d.reason == "MTPHitRateLow resolved"
    assert d.state.last_alert_time == at(50)
    # endsAt in the future (clock skew) is clipped to now; repeated → idempotent
    late = replace(resolved, ends_at=at(500))
    d2 = decide_rollback(d.state, late, SPEC, at(90))
    assert d2.state.last_alert_time == at(90)
    assert decide_rollback(d2.state, late, SPEC, at(90)).state == d2.state


def test_disabled() -> None:
    d = decide_rollback(pool(6), firing(), RollbackSpec(enabled=False), at(1))
    assert not d.changed and "disabled" in d.reason
    assert d.state.current_k == 6 and d.state.last_alert_time == at(1)


@pytest.mark.parametrize("value", [None, float("nan")])
def test_no_data_never_rolls_back(value: float | None) -> None:
    state = pool(6)
    d = decide_rollback(state, firing(value=value), SPEC, at(1))
    assert not d.changed and "no data" in d.reason and d.state == state


@pytest.mark.parametrize("value", [1.5, -0.2, float("inf"), float("-inf")])
@pytest.mark.parametrize("which", [HIT_RATE_LOW, ERROR_PROPAGATION_HIGH])
def test_impossible_values_never_roll_back(value: float, which: str) -> None:
    state = pool(6)
    d = decide_rollback(state, firing(which, value), SPEC, at(1))
    assert not d.changed and d.state == state
    assert "outside [0, 1]" in d.reason or "no data" in d.reason


def test_the_reason_never_rounds_a_value_onto_its_threshold() -> None:
    d = decide_rollback(pool(6), firing(value=0.879996), SPEC, at(1))
    assert d.changed and d.record is not None
    assert "0.879996 < 0.88" in d.reason and "0.88 < 0.88" not in d.reason
    d = decide_rollback(pool(6), firing(value=0.61), SPEC, at(1))
    assert "0.61 < 0.88" in d.reason


def test_resource_thresholds_decide() -> None:
    loose = RollbackSpec(min_hit_rate=0.6, max_error_propagation_rate=0.6)
    d = decide_rollback(pool(6), firing(value=0.7), loose, at(1))
    assert not d.changed and "within this resource's threshold 0.6" in d.reason
    assert d.state.last_alert_time is None  # healthy by this resource's standard
    d = decide_rollback(pool(6), firing(ERROR_PROPAGATION_HIGH, 0.5), loose, at(1))
    assert not d.changed
    d = decide_rollback(pool(6), firing(value=0.5), loose, at(1))
    assert d.new_k == 5 and d.record is not None and d.record.threshold == 0.6


def test_other_alerts_are_ignored() -> None:
    d = decide_rollback(pool(6), replace(firing(), alert="KubePodCrashLooping"), SPEC, at(1))
    assert not d.changed and d.state == pool(6)


def test_known_good_promotion_hysteresis() -> None:
    state = pool(6)
    assert known_good_due(state, SPEC) == at(600)
    assert promote_known_good(state, at(599), SPEC).known_good_k is None
    assert promote_known_good(state, at(600), SPEC).known_good_k == 6
    # an alert under these settings restarts the quiet period
    alerted = replace(state, last_alert_time=at(500))
    assert promote_known_good(alerted, at(1099), SPEC).known_good_k is None
    assert promote_known_good(alerted, at(1100), SPEC).known_good_k == 6
    # K=0 (no metrics at all) and an unknown start never become known-good
    assert promote_known_good(pool(0), at(10_000), SPEC).known_good_k is None
    assert promote_known_good(replace(state, settings_since=None), at(10_000), SPEC) == replace(
        state, settings_since=None
    )


def test_flapping_pool_is_rolled_back_once_per_alert() -> None:
    # alert at t=0 → K 6→5; the alert resolves at 4 min; the pool runs quietly.
    state = pool(6, known_good_k=None)
    d = decide_rollback(state, firing(), SPEC, at(0))
    state = d.state
    assert state.current_k == 5
    resolved = replace(firing(), status="resolved", ends_at=at(240))
    state = decide_rollback(state, resolved, SPEC, at(250)).state
    # time passes with no new alert: no signal → no call → nothing changes; after the
    # stabilization period K=5 becomes known-good
    state = promote_known_good(state, at(240 + 599), SPEC)
    assert state.known_good_k is None
    state = promote_known_good(state, at(240 + 600), SPEC)
    assert state.known_good_k == 5 and state.current_k == 5
    # a late duplicate of the old firing notification within cooldown does nothing
    assert not decide_rollback(state, firing(), SPEC, at(200)).changed
    # the alert flaps back much later: one step, from the known-good settings
    d = decide_rollback(state, firing(), SPEC, at(3600))
    assert d.new_k == 4
    # … and not again while it keeps flapping within the cooldown
    for t in (3610, 3700, 3800):
        assert not decide_rollback(d.state, firing(), SPEC, at(t)).changed


def test_user_reset_then_alert_restores_known_good() -> None:
    # after 6→5 and 5 stable, the user resets to 6; the alert fires again → straight to 5
    state = replace(pool(6), known_good_k=5, last_rollback_time=at(-3600))
    d = decide_rollback(state, firing(), SPEC, at(0))
    assert d.new_k == 5 and "restored known-good K=5" in d.reason


def test_effective_k_follows_the_spec_without_a_pin() -> None:
    e = effective_k(6, None, None, 4)
    assert (e.k, e.source, e.rollback_k) == (6, "spec", None)


def test_effective_k_keeps_a_pin_of_the_same_generation() -> None:
    e = effective_k(6, 4, 3, 3)
    assert (e.k, e.source, e.rollback_k) == (4, "rollback", 4)
    # the spec now asks for less than the pin: never raise K through a pin
    assert effective_k(2, 4, 3, 3).k == 2


def test_effective_k_new_generation_undoes_the_rollback() -> None:
    e = effective_k(6, 4, 3, 4)
    assert (e.k, e.source, e.rollback_k) == (6, "spec", None)
    assert "generation 3 -> 4" in e.reason


def test_effective_k_reset_annotation() -> None:
    e = effective_k(6, 4, 3, 3, reset_token="please-1", handled_reset_token=None)
    assert (e.k, e.rollback_k, e.handled_reset_token) == (6, None, "please-1")
    # the same token again does not undo a later rollback
    e2 = effective_k(6, 3, 3, 3, reset_token="please-1", handled_reset_token="please-1")
    assert (e2.k, e2.source, e2.handled_reset_token) == (3, "rollback", "please-1")
    # a token set while nothing is pinned is still marked handled
    e3 = effective_k(6, None, None, 3, reset_token="again", handled_reset_token="please-1")
    assert (e3.k, e3.handled_reset_token) == (6, "again")
    # an empty annotation is no token
    e4 = effective_k(6, 4, 3, 3, reset_token="", handled_reset_token="please-1")
    assert (e4.k, e4.handled_reset_token) == (4, "please-1")


def test_state_round_trips_through_status() -> None:
    state = PoolRollbackState(
        H100,
        current_k=5,
        spec_k=6,
        mtp_layers=1,
        known_good_k=6,
        settings_since=at(1),
        last_rollback_time=at(1),
        last_alert_time=at(2),
        rollback_k=5,
        rollback_generation=2,
    )
    entry = {
        "gpuProduct": H100,
        "numSpeculativeTokens": 5,
        "source": "rollback",
        "deployment": "dsv3-h100",
        **state.status_fields(),
    }
    assert PoolRollbackState.from_pool_status(entry, spec_k=6, mtp_layers=1) == state
    # keys the state does not use (other status fields) are ignored
    extra = {**entry, "replicas": 2, "somethingNew": "x"}
    assert PoolRollbackState.from_pool_status(extra, spec_k=6, mtp_layers=1) == state
    model = PoolStatus.model_validate(entry)
    assert PoolRollbackState.from_pool_status(model, spec_k=6, mtp_layers=1) == state


def test_time_helpers() -> None:
    assert format_time(at(0)) == "2026-11-29T12:00:00Z"
    assert parse_time("2026-11-29T12:00:00Z") == at(0)
    assert parse_time("2026-11-29T13:00:00+01:00") == at(0)
    assert parse_time(None) is None and parse_time("") is None
