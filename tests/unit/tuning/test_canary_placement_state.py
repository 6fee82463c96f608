"""tuning.state.canaries_taking_a_replica: what a trial started with holds to its end."""

from __future__ import annotations

from mtp_operator.api.tuning import PoolTuningStatus, TuningTrial
from mtp_operator.tuning.state import canaries_taking_a_replica


def _entry(kind: str, beside: bool) -> PoolTuningStatus:
    return PoolTuningStatus(mode="Auto", trial=TuningTrial(
        k=1, from_k=4, kind=kind, started="2026-12-01T08:00:00Z", beside_pool=beside))


def test_only_canaries_started_beside_the_pool_keep_its_replicas() -> None:
    tuning = {"H100": _entry("canary", True), "A100": _entry("canary", False),
              "L40S": PoolTuningStatus(mode="Auto")}
    got = canaries_taking_a_replica(["H100", "A100", "L40S", "H200"], tuning)
    # H100 runs beside; the others take a replica (no entry or no trial: as before)
    assert got == frozenset({"A100", "L40S", "H200"})


def test_the_placement_round_trips_through_status() -> None:
    from mtp_operator.tuning.state import trial_from, trial_status

    raw = TuningTrial(k=2, from_k=3, kind="canary", started="2026-12-01T08:00:00Z",
                      beside_pool=True, capacity_cost="none: the canary runs on a spare slot")
    back = trial_status(trial_from(raw))
    assert back.beside_pool and back.capacity_cost == raw.capacity_cost
    assert back.model_dump(by_alias=True)["besidePool"] is True
