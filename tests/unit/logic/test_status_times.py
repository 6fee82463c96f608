"""Status times read back as anything a hand edit or another writer may have left (issue 36):
a value that is not a usable time reads as absent, and `status.bad_times` names each one with
its path and reason for the log. Pure."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mtp_operator.api.tuning import PoolTuningStatus, TuningTrial
from mtp_operator.api.v1alpha1 import MTPInferenceStatus, PoolStatus
from mtp_operator.reconcile_plan import gone_since
from mtp_operator.rollback.policy import PoolRollbackState
from mtp_operator.status import bad_times
from mtp_operator.timestamps import parse_time, time_problem
from mtp_operator.tuning.state import guard_from, trial_from

pytestmark = pytest.mark.unit

H100 = "NVIDIA-H100-80GB-HBM3"
BAD = ["yesterday", "2026-13-45T00:00:00Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z",
       "1969-12-31T23:59:59Z", "9000-01-01T00:00:00Z"]
GOOD = "2026-11-29T12:00:00Z"


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_value_is_absent_and_its_problem_said(bad: str) -> None:
    assert parse_time(bad) is None
    assert time_problem(bad)


def test_good_values_and_the_bounds() -> None:
    assert parse_time(GOOD) == datetime(2026, 11, 29, 12, tzinfo=UTC)
    assert parse_time("1970-01-01T00:00:00Z") == datetime(1970, 1, 1, tzinfo=UTC)
    assert parse_time("2026-11-29T12:00:00") == datetime(2026, 11, 29, 12, tzinfo=UTC)
    assert parse_time(None) is None and parse_time("") is None
    assert time_problem(GOOD) is None and time_problem(None) is None


@pytest.mark.parametrize("field", ["settingsSince", "lastRollbackTime", "lastAlertTime"])
def test_a_pools_rollback_state_reads_a_bad_time_as_absent(field: str) -> None:
    entry = {"gpuProduct": H100, "deployment": "d", "numSpeculativeTokens": 6,
             "settingsSince": GOOD, "lastRollbackTime": GOOD, "lastAlertTime": GOOD}
    entry[field] = "yesterday"
    state = PoolRollbackState.from_pool_status(entry, spec_k=6)
    times = {"settingsSince": state.settings_since, "lastRollbackTime": state.last_rollback_time,
             "lastAlertTime": state.last_alert_time}
    assert times.pop(field) is None
    assert set(times.values()) == {datetime(2026, 11, 29, 12, tzinfo=UTC)}


def test_a_trial_with_a_bad_start_is_no_trial_and_a_bad_end_is_unended() -> None:
    assert trial_from(TuningTrial(k=3, from_k=6, kind="canary", started="soon")) is None
    t = trial_from(TuningTrial(k=3, from_k=6, kind="canary", started=GOOD, ended="later"))
    assert t is not None and t.ended is None


def test_guard_and_gone_since_read_bad_times_as_absent() -> None:
    pool = PoolStatus(gpu_product=H100, deployment="d", num_speculative_tokens=6, source="profile",
                      last_rollback_time="9999-12-31T23:59:59Z", last_alert_time="x",
                      product_gone_since="2026-02-30T00:00:00Z")
    guard = guard_from(pool, 600, datetime(2026, 11, 29, tzinfo=UTC), 300)
    assert guard.cooldown_until is None and not guard.alert_firing
    assert gone_since(MTPInferenceStatus(pools=[pool])) == {}


def test_bad_times_names_each_by_path_and_value() -> None:
    tuning = PoolTuningStatus(
        mode="Auto",
        trial=TuningTrial(k=3, from_k=6, kind="canary", started="soon"),
        trials=[TuningTrial(k=4, from_k=6, kind="canary", started=GOOD, ended="9999-1-1")],
    )
    pool = PoolStatus(gpu_product=H100, deployment="d", num_speculative_tokens=6, source="profile",
                      settings_since=GOOD, last_alert_time="yesterday", tuning=tuning)
    said = bad_times(MTPInferenceStatus(pools=[pool]))
    assert [s.split(" ")[0] for s in said] == [
        f"status.pools[{H100}].lastAlertTime",
        f"status.pools[{H100}].tuning.trial.started",
        f"status.pools[{H100}].tuning.trials[0].ended",
    ]
    assert "'yesterday'" in said[0] and said[0].endswith("read as absent")
    assert bad_times(MTPInferenceStatus(pools=[pool.model_copy(
        update={"last_alert_time": GOOD, "tuning": None})])) == []
