"""conditions.py and status.py: the status the operator writes, with frozen clocks."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mtp_operator import conditions as c
from mtp_operator.api.v1alpha1 import MTPInferenceSpec, MTPInferenceStatus
from mtp_operator.planning import PoolPlan, plan_pool
from mtp_operator.status import (
    MAX_REMOVED_POOLS,
    ObservedPool,
    StatusInput,
    observe_deployment,
    read_status,
    short_product,
    status_changed,
    to_wire,
)
from mtp_operator.status import build_status as build_typed_status

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:05:00Z"
T2 = "2026-01-01T00:10:00Z"

H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
A100 = "NVIDIA-A100-SXM4-80GB"
L40S = "NVIDIA-L40S"
PRODUCTS = [A100, H100, H200, L40S]


def _conds(conditions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {x["type"]: x for x in conditions}


# ---- conditions.merge -----------------------------------------------------------------------


def test_merge_sets_every_field() -> None:
    out = c.merge([], [c.Want(c.READY, True, "AllPoolsReady", "2/2")], T0, 3)
    assert out == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "AllPoolsReady",
            "message": "2/2",
            "lastTransitionTime": T0,
            "observedGeneration": 3,
        }
    ]


def test_merge_keeps_the_time_while_the_status_holds() -> None:
    first = c.merge([], [c.Want(c.READY, False, "PoolsNotReady", "0/2")], T0, 1)
    # new reason, message and generation, same status: the transition time stays
    second = c.merge(first, [c.Want(c.READY, False, "RollingOut", "1/2")], T1, 2)
    (ready,) = second
    assert ready["lastTransitionTime"] == T0
    assert (ready["reason"], ready["message"], ready["observedGeneration"]) == (
        "RollingOut",
        "1/2",
        2,
    )


def test_merge_changes_the_time_when_the_status_flips() -> None:
    first = c.merge([], [c.Want(c.READY, False, "PoolsNotReady")], T0, 1)
    flipped = c.merge(first, [c.Want(c.READY, True, "AllPoolsReady")], T1, 1)
    assert flipped[0]["lastTransitionTime"] == T1
    back = c.merge(flipped, [c.Want(c.READY, False, "PoolsNotReady")], T2, 1)
    assert back[0]["lastTransitionTime"] == T2


def test_merge_keeps_unmentioned_conditions_and_orders_them() -> None:
    custom = {"type": "AAACustom", "status": "True", "reason": "x", "lastTransitionTime": T0}
    first = c.merge(
        [custom],
        [
            c.Want(c.ROLLED_BACK, False, c.REASON_NOT_ROLLED_BACK),
            c.Want(c.DEGRADED, False, c.REASON_HEALTHY),
            c.Want(c.READY, True, c.REASON_ALL_POOLS_READY),
            c.Want(c.PROGRESSING, False, c.REASON_STABLE),
        ],
        T1,
        1,
    )
    assert [x["type"] for x in first] == [
        "Ready",
        "Progressing",
        "Degraded",
        "SpeculationRolledBack",
        "AAACustom",
    ]
    assert first[-1] == custom
    only_ready = c.merge(first, [c.Want(c.READY, False, c.REASON_POOLS_NOT_READY)], T2, 2)
    assert [x["type"] for x in only_ready] == [x["type"] for x in first]
    assert _conds(only_ready)["Progressing"] == _conds(first)["Progressing"]


def test_merge_does_not_modify_its_input() -> None:
    first = c.merge([], [c.Want(c.READY, False, "A")], T0, 1)
    saved = copy.deepcopy(first)
    c.merge(first, [c.Want(c.READY, True, "B")], T1, 2)
    assert first == saved


def test_merge_tolerates_a_condition_without_time() -> None:
    """A hand-written status (kubectl edit --subresource=status) may lack the time."""
    old = [{"type": "Ready", "status": "True", "reason": "x"}]
    (ready,) = c.merge(old, [c.Want(c.READY, True, "AllPoolsReady")], T1, 1)
    assert ready["lastTransitionTime"] == T1


def test_same_ignoring_time() -> None:
    a = c.merge([], [c.Want(c.READY, True, "A", "m")], T0, 1)
    b = [{**a[0], "lastTransitionTime": T2}]
    assert c.same_ignoring_time(a, b)
    assert not c.same_ignoring_time(a, [{**a[0], "message": "other"}])
    assert not c.same_ignoring_time(a, [])


# ---- status.build_status --------------------------------------------------------------------


def _spec(**fields: Any) -> MTPInferenceSpec:
    return MTPInferenceSpec.model_validate({"model": "org/model", **fields})


def _plans(spec: MTPInferenceSpec | None = None, products=PRODUCTS, **pins) -> list[PoolPlan]:
    spec = spec or _spec()
    return [plan_pool(spec, p, rollback_k=pins.get(p)) for p in products]


def _ready(n: int = 1) -> ObservedPool:
    return ObservedPool(desired=n, ready=n, up_to_date=True)


def build_status(inputs: StatusInput, now: str) -> dict[str, Any]:
    """The status as written to the API server (the typed status, on the wire)."""
    status = build_typed_status(inputs, now)
    assert isinstance(status, MTPInferenceStatus)
    return to_wire(status)


def _input(plans: list[PoolPlan], observed: dict[str, ObservedPool], **kw: Any) -> StatusInput:
    return StatusInput(
        name=kw.pop("name", "res"),
        generation=kw.pop("generation", 1),
        previous=read_status(kw.pop("previous", {})),
        plans=plans,
        observed=observed,
        rollback_state=kw.pop("rollback_state", {}),
        settings_hashes=kw.pop(
            "settings_hashes", {p.gpu_product: "h-" + p.gpu_product for p in plans}
        ),
        **kw,
    )


def test_ready() -> None:
    plans = _plans()
    status = build_status(_input(plans, {p: _ready(2) for p in PRODUCTS}), T0)
    assert status["phase"] == "Ready"
    assert status["ready"] == "8/8"
    assert status["poolsSummary"] == "A100:4 H100:6 H200:6 L40S:2"
    assert status["observedGeneration"] == 1
    conds = _conds(status["conditions"])
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("True", "AllPoolsReady")
    assert conds["Ready"]["message"] == "8/8 replicas ready"
    assert (conds["Progressing"]["status"], conds["Progressing"]["reason"]) == ("False", "Stable")
    assert (conds["Degraded"]["status"], conds["Degraded"]["reason"]) == ("False", "Healthy")
    assert conds["SpeculationRolledBack"]["status"] == "False"
    assert all(x["lastTransitionTime"] == T0 for x in status["conditions"])
    h100 = next(p for p in status["pools"] if p["gpuProduct"] == H100)
    assert h100 == {
        "gpuProduct": H100,
        "numSpeculativeTokens": 6,
        "source": "profile",
        "reason": "GPU profile for H100",
        "replicas": 2,
        "readyReplicas": 2,
        "deployment": "res-h100-80gb-hbm3",
        "settingsHash": "h-" + H100,
    }
    # what the operator writes is a valid MTPInference status
    MTPInferenceStatus.model_validate(status)


@pytest.mark.parametrize(
    "observed",
    [
        {p: _ready() for p in PRODUCTS if p != H200},  # H200's Deployment not seen yet
        {**{p: _ready() for p in PRODUCTS}, H200: ObservedPool(1, 1, up_to_date=False)},
        {**{p: _ready() for p in PRODUCTS}, H200: ObservedPool(1, 0, up_to_date=True)},
    ],
    ids=["not-created", "rolling", "not-ready"],
)
def test_progressing(observed: dict[str, ObservedPool]) -> None:
    status = build_status(_input(_plans(), observed), T0)
    assert status["phase"] == "Progressing"
    conds = _conds(status["conditions"])
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "PoolsNotReady"
    if H200 not in observed or not observed[H200].up_to_date:
        assert conds["Progressing"]["status"] == "True"
        assert conds["Progressing"]["message"] == f"rolling out: {H200}"
    if H200 not in observed:
        assert status["ready"] == "3/3"  # a pool not created yet counts no replicas


def test_no_pools_is_not_ready() -> None:
    status = build_status(_input([], {}), T0)
    assert status["phase"] == "Progressing" and status["ready"] == "0/0"
    assert status["poolsSummary"] == "" and status["pools"] == []


def test_scaled_to_zero_is_ready() -> None:
    observed = {p: ObservedPool(0, 0, True) for p in PRODUCTS}
    status = build_status(_input(_plans(_spec(replicas=0)), observed), T0)
    assert status["phase"] == "Ready" and status["ready"] == "0/0"
    assert _conds(status["conditions"])["Ready"]["reason"] == "ScaledToZero"


def test_apply_error_is_degraded() -> None:
    inp = _input(_plans(), {p: _ready() for p in PRODUCTS}, apply_error="500: etcd timeout")
    status = build_status(inp, T0)
    assert status["phase"] == "Degraded"
    deg = _conds(status["conditions"])["Degraded"]
    assert (deg["status"], deg["reason"], deg["message"]) == (
        "True",
        "ApplyFailed",
        "500: etcd timeout",
    )


def test_rolled_back_pool() -> None:
    plans = _plans(**{H100: 4})
    rollback = {
        H100: {"rollbackK": 4, "rollbackGeneration": 1, "knownGoodK": None, "lastRollbackTime": T0}
    }
    status = build_status(
        _input(plans, {p: _ready() for p in PRODUCTS}, rollback_state=rollback), T1
    )
    assert status["poolsSummary"] == "A100:4 H100:4 H200:6 L40S:2"
    rb = _conds(status["conditions"])["SpeculationRolledBack"]
    assert (rb["status"], rb["reason"]) == ("True", "RolledBack")
    assert rb["message"] == f"{H100} K=4 (rolled back from K=6)"
    h100 = next(p for p in status["pools"] if p["gpuProduct"] == H100)
    assert h100["source"] == "rollback"
    assert (h100["rollbackK"], h100["rollbackGeneration"], h100["lastRollbackTime"]) == (4, 1, T0)
    assert "knownGoodK" not in h100  # None values are left out
    assert status["phase"] == "Ready"  # a rollback is not a failure


def test_summary_uses_short_product_names() -> None:
    products = ["NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "NVIDIA-RTX-PRO-6000", "Tesla-T4"]
    status = build_status(_input(_plans(products=products), {}), T0)
    # a MIG slice is told from its card, and plans the K of its share (1/7 of an A100's 4)
    assert status["poolsSummary"] == "A100-MIG-1g.5gb:1 RTX-PRO-6000:3 T4:1"
    assert short_product("NVIDIA-H200-SHARED") == "H200-SHARED"
    assert short_product("NVIDIA-H200") == "H200"


def _invalid_input(previous: dict[str, Any], **kw: Any) -> StatusInput:
    return _input(
        [],
        {},
        previous=previous,
        generation=kw.pop("generation", 5),
        rollback_state={},
        settings_hashes={},
        problems=kw.pop("problems", [("speculative.method", "'eagle' is not an MTP method")]),
        **kw,
    )


def _serving_status() -> dict[str, Any]:
    plans = _plans()
    status = build_status(_input(plans, {p: _ready() for p in PRODUCTS}, removed=["Tesla-T4"]), T0)
    status["rollbacks"] = [{"time": T0, "gpuProduct": H100, "fromK": 6, "toK": 5, "alert": "x"}]
    status["rollbackResetToken"] = "tok"
    return status


def test_invalid_spec_keeps_the_previous_pools() -> None:
    previous = _serving_status()
    status = build_status(_invalid_input(previous), T1)
    assert status["phase"] == "Invalid" and status["observedGeneration"] == 5
    for key in (
        "pools",
        "poolsSummary",
        "ready",
        "removedPools",
        "rollbacks",
        "rollbackResetToken",
    ):
        assert status[key] == previous[key], key
    conds = _conds(status["conditions"])
    deg = conds["Degraded"]
    assert (deg["status"], deg["reason"]) == ("True", "InvalidSpec")
    assert deg["message"] == "speculative.method: 'eagle' is not an MTP method"
    assert deg["lastTransitionTime"] == T1 and deg["observedGeneration"] == 5
    prog = conds["Progressing"]
    assert (prog["status"], prog["reason"]) == ("False", "InvalidSpec")
    assert prog["lastTransitionTime"] == T0  # it was False already
    assert conds["Ready"] == _conds(previous["conditions"])["Ready"]  # pools still serve
    assert previous["phase"] == "Ready"  # the input is not modified


def test_invalid_spec_on_a_new_resource() -> None:
    status = build_status(_invalid_input({}, problems=[("model", "Field required")]), T0)
    assert status["phase"] == "Invalid"
    assert "pools" not in status
    MTPInferenceStatus.model_validate(status)


def test_no_fitting_nodes_is_degraded_and_keeps_pools() -> None:
    previous = _serving_status()
    status = build_status(
        _invalid_input(
            previous,
            problems=[("gpuProducts", "no schedulable node has 8 allocatable nvidia.com/gpu")],
            problem_reason=c.REASON_NO_FITTING_NODES,
        ),
        T1,
    )
    assert status["phase"] == "Degraded"
    assert _conds(status["conditions"])["Degraded"]["reason"] == "NoFittingNodes"
    assert status["pools"] == previous["pools"]


def test_removed_pools_are_bounded_most_recent_last() -> None:
    previous: dict[str, Any] = {}
    plans = _plans(products=[H100])
    for i in range(MAX_REMOVED_POOLS + 5):
        previous = build_status(_input(plans, {}, previous=previous, removed=[f"GPU-{i}"]), T0)
    removed = previous["removedPools"]
    assert len(removed) == MAX_REMOVED_POOLS == 10
    assert removed == [f"GPU-{i}" for i in range(5, 15)]
    # no duplicates; a product that has a pool again leaves the list
    again = build_status(
        _input(_plans(products=[H100, "GPU-9"]), {}, previous=previous, removed=["GPU-14"]), T0
    )
    assert "GPU-9" not in again["removedPools"]
    assert again["removedPools"].count("GPU-14") == 1


# ---- status_changed -------------------------------------------------------------------------


def test_status_changed_ignores_only_transition_times() -> None:
    observed = {p: _ready() for p in PRODUCTS}
    first = build_status(_input(_plans(), observed), T0)
    again = build_status(_input(_plans(), observed, previous=first), T1)
    assert again == first  # times kept: nothing to write
    assert not status_changed(first, again)
    only_times = copy.deepcopy(first)
    for cond in only_times["conditions"]:
        cond["lastTransitionTime"] = T2
    assert not status_changed(first, only_times)


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s["conditions"][0].update(message="other"),
        lambda s: s["conditions"][0].update(reason="Other"),
        lambda s: s["conditions"][0].update(observedGeneration=9),
        lambda s: s["conditions"].pop(),
        lambda s: s.update(ready="3/4"),
        lambda s: s.update(observedGeneration=2),
        lambda s: s["pools"][0].update(numSpeculativeTokens=3),
        lambda s: s.update(rollbackResetToken="t"),
    ],
)
def test_status_changed_sees_everything_else(edit) -> None:
    first = build_status(_input(_plans(), {p: _ready() for p in PRODUCTS}), T0)
    new = copy.deepcopy(first)
    edit(new)
    assert status_changed(first, new)
    assert status_changed({}, first)


# ---- observe_deployment ---------------------------------------------------------------------


def _deploy(want: int, generation: int, **status: int) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "spec": {"replicas": want}, "status": status}


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (_deploy(2, 3, observedGeneration=3, updatedReplicas=2, replicas=2, readyReplicas=2),
         ObservedPool(2, 2, True)),
        (_deploy(2, 3, observedGeneration=2, updatedReplicas=2, replicas=2, readyReplicas=2),
         ObservedPool(2, 2, False)),  # the controller hasn't seen the new spec
        (_deploy(2, 3, observedGeneration=3, updatedReplicas=1, replicas=2, readyReplicas=2),
         ObservedPool(2, 2, False)),  # half rolled
        (_deploy(2, 3, observedGeneration=3, updatedReplicas=2, replicas=3, readyReplicas=2),
         ObservedPool(2, 2, False)),  # an old pod still terminating
        (_deploy(0, 1, observedGeneration=1), ObservedPool(0, 0, True)),
        ({"metadata": {}, "spec": {}, "status": {}}, ObservedPool(1, 0, False)),
    ],
)  # fmt: skip
def test_observe_deployment(body: dict[str, Any], want: ObservedPool) -> None:
    assert observe_deployment(body) == want
