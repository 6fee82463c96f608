"""rollback/state.py: the per-pool rollback state carried in status.pools[] from one reconcile
to the next, over frozen clocks. (The decisions themselves:
tests/unit/rollback/test_rollback_policy.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from mtp_operator.api.v1alpha1 import MTPInferenceSpec, RollbackSpec
from mtp_operator.planning import plan_pool
from mtp_operator.rollback.state import pool_rollback_state
from mtp_operator.timestamps import format_time

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
SPEC = MTPInferenceSpec.model_validate({"model": "org/model"})  # auto: H100 and H200 take 6
RB = RollbackSpec()  # stabilization 600 s


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ts(seconds: float) -> str:
    return format_time(at(seconds))


def _pool(product: str = H100, k: int = 6, **fields: Any) -> dict[str, Any]:
    return {
        "gpuProduct": product,
        "numSpeculativeTokens": k,
        "source": "profile",
        "deployment": "d",
        **fields,
    }


def _pinned(k: int = 4, generation: int = 2, **fields: Any) -> dict[str, Any]:
    return _pool(
        k=k, source="rollback", rollbackK=k, rollbackGeneration=generation,
        lastRollbackTime=ts(0), settingsSince=ts(0), knownGoodK=5, **fields,
    )  # fmt: skip


def _meta(token: str | None = None) -> dict[str, Any]:
    return {"annotations": {"mtp-operator.io/reset-rollback": token}} if token else {}


# ---- pins -----------------------------------------------------------------------------------


def test_pin_kept_within_the_same_generation() -> None:
    view = pool_rollback_state({"pools": [_pinned(generation=2)]}, _meta(), 2, at(60))
    assert view.k_for(H100) == 4
    assert view.k_for(H200) is None
    plan = plan_pool(SPEC, H100, rollback_k=view.k_for(H100))
    fields = view.by_product([plan], RB, None)[H100]
    assert (plan.k, plan.source) == (4, "rollback")
    assert (fields["rollbackK"], fields["rollbackGeneration"]) == (4, 2)
    assert fields["lastRollbackTime"] == ts(0) and fields["settingsSince"] == ts(0)
    assert fields["knownGoodK"] == 5
    assert view.status_extras() == {}


def test_new_generation_drops_the_pin_but_keeps_the_memory() -> None:
    view = pool_rollback_state({"pools": [_pinned(generation=2)]}, _meta(), 3, at(60))
    assert view.k_for(H100) is None
    plan = plan_pool(SPEC, H100, rollback_k=view.k_for(H100))
    assert (plan.k, plan.source) == (6, "profile")
    fields = view.by_product([plan], RB, None)[H100]
    assert fields["rollbackK"] is None and fields["rollbackGeneration"] is None
    # the known-good K and the cooldown clock survive
    assert fields["knownGoodK"] == 5 and fields["lastRollbackTime"] == ts(0)
    # the pin is gone, so K changed: its settings start now
    assert fields["settingsSince"] == ts(60)


def test_pin_must_match_the_generation_exactly() -> None:
    def pin(pinned_at: int | None, now: int | None) -> int | None:
        previous = {"pools": [_pinned(generation=pinned_at)]}  # type: ignore[arg-type]
        return pool_rollback_state(previous, {}, now, T0).k_for(H100)

    assert pin(2, None) is None and pin(None, 2) is None and pin(3, 2) is None
    assert pin(None, None) == 4


def test_new_reset_token_drops_the_pin_and_is_remembered() -> None:
    previous = {"pools": [_pinned(generation=2)], "rollbackResetToken": "old"}
    view = pool_rollback_state(previous, _meta("new"), 2, at(60))
    assert view.k_for(H100) is None
    assert view.handled_reset_token == "new"
    assert view.status_extras() == {"rollbackResetToken": "new"}


def test_handled_token_does_not_undo_a_later_rollback() -> None:
    previous = {"pools": [_pinned(generation=2)], "rollbackResetToken": "tok"}
    view = pool_rollback_state(previous, _meta("tok"), 2, at(60))
    assert view.k_for(H100) == 4
    assert view.status_extras() == {"rollbackResetToken": "tok"}
    # the annotation removed: the handled token is still remembered
    gone = pool_rollback_state(previous, _meta(None), 2, at(60))
    assert gone.k_for(H100) == 4 and gone.handled_reset_token == "tok"


def test_a_token_with_nothing_pinned_is_still_marked_handled() -> None:
    view = pool_rollback_state({"pools": [_pool()]}, _meta("t1"), 1, T0)
    assert view.handled_reset_token == "t1"
    assert pool_rollback_state({}, {}, 1, T0).status_extras() == {}


def test_only_the_pinned_pool_is_affected() -> None:
    previous = {"pools": [_pinned(generation=2), _pool(H200, settingsSince=ts(0))]}
    view = pool_rollback_state(previous, _meta(), 2, at(60))
    assert (view.k_for(H100), view.k_for(H200)) == (4, None)
    plans = [plan_pool(SPEC, p, rollback_k=view.k_for(p)) for p in (H100, H200)]
    assert [(p.k, p.source) for p in plans] == [(4, "rollback"), (6, "profile")]


def test_previous_status_is_not_modified() -> None:
    previous = {"pools": [_pinned(generation=2)]}
    pool_rollback_state(previous, _meta(), 3, at(60))
    assert previous["pools"][0]["rollbackK"] == 4


# ---- known-good promotion and settingsSince -------------------------------------------------


def _fields(previous: dict[str, Any], now: datetime, spec: MTPInferenceSpec = SPEC) -> dict:
    view = pool_rollback_state(previous, {}, 1, now)
    plan = plan_pool(spec, H100, rollback_k=view.k_for(H100))
    return view.by_product([plan], spec.rollback, spec.speculative.mtp_layers)[H100]


def test_new_pool_starts_its_settings_now() -> None:
    fields = _fields({}, at(5))
    assert fields["settingsSince"] == ts(5)
    assert fields["knownGoodK"] is None
    assert fields["rollbackK"] is None and fields["lastAlertTime"] is None


def test_known_good_after_stabilization() -> None:
    previous = {"pools": [_pool(settingsSince=ts(0))]}
    assert _fields(previous, at(599))["knownGoodK"] is None
    assert _fields(previous, at(600))["knownGoodK"] == 6
    assert _fields(previous, at(600))["settingsSince"] == ts(0)  # K unchanged: time kept


def test_an_alert_delays_known_good() -> None:
    previous = {"pools": [_pool(settingsSince=ts(0), lastAlertTime=ts(300))]}
    assert _fields(previous, at(899))["knownGoodK"] is None
    assert _fields(previous, at(900))["knownGoodK"] == 6


def test_stabilization_window_from_the_spec() -> None:
    spec = MTPInferenceSpec.model_validate({"model": "m", "rollback": {"stabilizationSeconds": 60}})
    previous = {"pools": [_pool(settingsSince=ts(0))]}
    assert _fields(previous, at(59), spec)["knownGoodK"] is None
    assert _fields(previous, at(60), spec)["knownGoodK"] == 6


def test_settings_since_restarts_when_k_changes() -> None:
    # the pool ran K=4 (say a previous spec); the spec now asks for 6
    previous = {"pools": [_pool(k=4, settingsSince=ts(0), knownGoodK=4)]}
    fields = _fields(previous, at(1000))
    assert fields["settingsSince"] == ts(1000)
    assert fields["knownGoodK"] == 4  # 6 has not proven itself yet
    later = {"pools": [_pool(k=6, **{k: v for k, v in fields.items() if v is not None})]}
    assert _fields(later, at(1599))["knownGoodK"] == 4
    assert _fields(later, at(1600))["knownGoodK"] == 6


def test_speculation_off_never_becomes_known_good() -> None:
    off = MTPInferenceSpec.model_validate(
        {"model": "m", "speculative": {"numSpeculativeTokens": 0}}
    )
    previous = {"pools": [_pool(k=0, settingsSince=ts(0), knownGoodK=4)]}
    assert _fields(previous, at(10_000), off)["knownGoodK"] == 4


def test_missing_settings_since_starts_now() -> None:
    fields = _fields({"pools": [_pool()]}, at(42))
    assert fields["settingsSince"] == ts(42) and fields["knownGoodK"] is None


def test_times_are_rfc3339_utc() -> None:
    fields = _fields({"pools": [_pool(settingsSince="2026-11-29T13:00:00+01:00")]}, at(600))
    assert fields["settingsSince"] == "2026-11-29T12:00:00Z"
    assert fields["knownGoodK"] == 6
