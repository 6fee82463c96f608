"""The status's size is bounded by design (issue 36: a worst-case tuning status was ~15.5 KB a
pool, 1.6 MB at 100 pools, over etcd's 1.5 MiB object limit).

The design (`status.bounded`, applied to every status a pass writes, and the pool cap in
`reconcile_plan.plan_pass`): a resource has at most MAX_STATUS_POOLS pools (GPU products x
traffic classes; more is refused, naming the field and the limit); the first
MAX_FULL_POOL_ENTRIES pool entries carry their tuning report in full, the others only the
tuning state the operator reads back (mode, recommended K, trial, trial history, tuned K); every
free-text field, list and summary has a cap. The worst case is built here from the schema's
own limits (the longest names Kubernetes and the API allow, every list at its cap, every
optional field set, every number at its longest JSON spelling), not from what a pass happens to
write, and serialised the way the API server stores it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from mtp_operator.api.classes import MAX_CLASS_NAME, MAX_CLASSES
from mtp_operator.api.tuning import (
    MAX_CAPACITY_COST_CHARS,
    MAX_TRIAL_HISTORY,
    MAX_TUNING_ROWS,
    PoolTuningStatus,
)
from mtp_operator.api.v1alpha1 import MAX_ROLLBACK_HISTORY, MTPInferenceSpec, MTPInferenceStatus
from mtp_operator.planning import GPUNode
from mtp_operator.reconcile_plan import plan_pass
from mtp_operator.status import (
    MAX_CONDITION_MESSAGE,
    MAX_CONDITIONS,
    MAX_FIT_ENTRIES,
    MAX_FULL_POOL_ENTRIES,
    MAX_REMOVED_POOLS,
    MAX_STATUS_POOLS,
    MAX_STATUS_TEXT,
    MAX_SUMMARY,
    SUMMARISED_NOTE,
    bounded,
    bounded_tuning,
    status_changed,
    to_wire,
)
from mtp_operator.tuning.state import stamped
from mtp_runtime.vllm_command import MAX_SPECULATIVE_TOKENS

pytestmark = pytest.mark.unit

ETCD_LIMIT = 1_572_864  # 1.5 MiB: etcd's default --max-request-bytes, the object's ceiling
LABEL_VALUE = 63  # a Kubernetes label value (the GPU product comes from a node label)
DNS_LABEL = 63  # a Deployment name the operator makes (naming.dns_label)
# the longest JSON spelling of a float (sign, 17 significant digits, point, e-308): 24 chars
LONG_FLOAT = -2.2250738585072014e-308
LONG_INT = -(2**31)  # int32 fields; -2147483648 is their longest spelling
TIME = "2026-12-06T05:00:00.123456Z"  # RFC 3339 with microseconds: longer than format_time's
HUGE = "x" * 100_000  # free text as long as any code path could make it


def _text(n: int = len(HUGE)) -> str:
    return HUGE[:n]


def _trial() -> dict:
    return {"k": LONG_INT, "fromK": LONG_INT, "kind": "canary", "started": TIME, "ended": TIME,
            "outcome": "superseded", "reason": _text(), "besidePool": True,
            "capacityCost": _text(MAX_CAPACITY_COST_CHARS)}


def _tuning() -> dict:
    k_values = MAX_SPECULATIVE_TOKENS + 1
    return {
        "mode": "Recommend",
        "recommendedK": LONG_INT,
        "reason": _text(),
        "measured": [{"k": LONG_INT, "outputTokensPerSecond": LONG_FLOAT,
                      "concurrency": LONG_FLOAT, "acceptance": [LONG_FLOAT] * 200,
                      "tokensPerStep": LONG_FLOAT, "windowSeconds": LONG_FLOAT,
                      "windowEnd": TIME, "replicas": LONG_INT}] * MAX_TUNING_ROWS,
        "estimates": [{"k": LONG_INT, "outputTokensPerSecond": LONG_FLOAT,
                       "uncertainty": LONG_FLOAT, "tokensPerStep": LONG_FLOAT,
                       "basis": "extrapolated", "detail": _text()}] * MAX_TUNING_ROWS,
        "stepCost": {"model": _text(), "baseSeconds": LONG_FLOAT, "perTokenSeconds": LONG_FLOAT,
                     "baseSecondsError": LONG_FLOAT, "perTokenSecondsError": LONG_FLOAT,
                     "windows": LONG_INT, "ks": [LONG_INT] * 200, "rmseSeconds": LONG_FLOAT},
        "capacity": {"k": LONG_INT, "peakRunning": LONG_FLOAT, "kvCacheUsage": LONG_FLOAT,
                     "estimatedCapacity": LONG_FLOAT, "headroom": LONG_FLOAT,
                     "waitingForCapacity": LONG_FLOAT},
        "recommendedSchedule": [{"minBatchSize": 2**31 - 1, "maxBatchSize": 2**31 - 1,
                                 "numSpeculativeTokens": MAX_SPECULATIVE_TOKENS}]
        * (10 * k_values),
        "trial": _trial(),
        "trials": [_trial()] * MAX_TRIAL_HISTORY,
        "tunedK": LONG_INT,
        "generation": 2**63 - 1,  # metadata.generation is int64
        "updated": TIME,
    }


def _pool(i: int) -> dict:
    product = f"{i:04d}" + "P" * (LABEL_VALUE - 4)
    return {
        "gpuProduct": product, "numSpeculativeTokens": LONG_INT, "source": "rollback",
        "reason": _text(), "replicas": LONG_INT, "readyReplicas": LONG_INT,
        "deployment": "d" * DNS_LABEL, "settingsHash": "f" * 16,
        "rollbackK": LONG_INT, "rollbackGeneration": 2**63 - 1, "lastRollbackTime": TIME,
        "knownGoodK": LONG_INT, "settingsSince": TIME, "lastAlertTime": TIME,
        "retained": "NoSchedulableNode", "productGoneSince": TIME, "tuning": _tuning(),
        "trafficClass": "c" * MAX_CLASS_NAME, "nodesPerReplica": LONG_INT,
    }


def worst_case_status() -> MTPInferenceStatus:
    condition = {"type": "SpeculationRolledBack", "status": "Unknown", "reason": _text(),
                 "message": _text(), "lastTransitionTime": TIME,
                 "observedGeneration": 2**63 - 1}
    rollback = {"time": TIME, "gpuProduct": "P" * LABEL_VALUE, "fromK": LONG_INT,
                "toK": LONG_INT, "alert": _text(), "value": LONG_FLOAT,
                "threshold": LONG_FLOAT, "reason": _text(), "via": "alertmanager",
                "trafficClass": "c" * MAX_CLASS_NAME}
    fit = {"gpuProduct": "P" * LABEL_VALUE, "verdict": "DoesNotFit",
           "nodesPerReplica": LONG_INT, "gpusPerNode": LONG_INT, "gpuMemoryMib": LONG_INT,
           "message": _text()}
    return MTPInferenceStatus.model_validate({
        "observedGeneration": 2**63 - 1,
        "phase": "Progressing",
        "conditions": [condition] * (MAX_CONDITIONS + 10),
        "pools": [_pool(i) for i in range(MAX_STATUS_POOLS)],
        "rollbacks": [rollback] * (MAX_ROLLBACK_HISTORY + 10),
        "poolsSummary": _text(), "tuningSummary": _text(), "ready": _text(),
        "rollbackResetToken": "t" * 253,  # see the test's note
        "fit": [fit] * (MAX_FIT_ENTRIES + 10),
        "fitSummary": _text(),
        "removedPools": ["P" * LABEL_VALUE + "/" + "c" * MAX_CLASS_NAME]
        * (MAX_REMOVED_POOLS + 10),
    })


def _stored_bytes(status: MTPInferenceStatus) -> int:
    """The status as JSON (the API server keeps custom resources as JSON in etcd; the spaced
    separators here make it a little larger than the compact form it stores)."""
    return len(json.dumps({"status": to_wire(status)}, ensure_ascii=False).encode())


def test_the_worst_case_status_is_under_etcds_limit_with_room_to_spare() -> None:
    """The whole worst case (MAX_STATUS_POOLS pools, every one maximal) fits with over a third
    of the limit left for metadata and spec (measured: 884,853 bytes, 56.3 %).

    Note: rollbackResetToken mirrors the user's `mtp-operator.io/reset-rollback` annotation,
    which the object already holds; it is taken at 253 characters here (a timestamp or a short
    word is what it is for), not at Kubernetes' 256 KiB for all annotations."""
    raw = worst_case_status()
    assert _stored_bytes(raw) > ETCD_LIMIT  # unbounded, the same content does not fit
    size = _stored_bytes(bounded(raw))
    print(f"worst-case status: {size} bytes of {ETCD_LIMIT} ({size / ETCD_LIMIT:.1%}); "
          f"unbounded {_stored_bytes(raw)}")
    assert size < ETCD_LIMIT * 2 // 3, size


def test_the_pool_entries_are_most_of_the_budget_and_summarised_ones_cost_a_quarter() -> None:
    """The per-entry figures the design rests on (docs/operations.md states them): the pools
    are the status, all but a fixed rest; a summarised entry costs under a quarter of a full
    one, which is what lets MAX_STATUS_POOLS be four times MAX_FULL_POOL_ENTRIES."""
    status = bounded(worst_case_status())
    wire = to_wire(status)
    full = len(json.dumps(wire["pools"][0]).encode())
    summarised = len(json.dumps(wire["pools"][-1]).encode())
    rest = _stored_bytes(status) - len(json.dumps(wire["pools"]).encode())
    print(f"full pool entry {full} bytes, summarised {summarised} bytes, the rest {rest} bytes")
    assert summarised < full / 4
    assert _stored_bytes(status) <= (MAX_FULL_POOL_ENTRIES * full
                                     + (MAX_STATUS_POOLS - MAX_FULL_POOL_ENTRIES) * summarised
                                     + rest + 2 * MAX_STATUS_POOLS)  # ", " between entries
    assert MAX_STATUS_POOLS == 4 * MAX_FULL_POOL_ENTRIES


def test_the_bounds_engage_on_each_field() -> None:
    status = bounded(worst_case_status())
    assert len(status.pools) == MAX_STATUS_POOLS
    full, rest = status.pools[:MAX_FULL_POOL_ENTRIES], status.pools[MAX_FULL_POOL_ENTRIES:]
    for pool in full:
        t = pool.tuning
        assert t is not None and len(t.measured) == MAX_TUNING_ROWS and t.step_cost is not None
        assert all(len(m.acceptance) == MAX_SPECULATIVE_TOKENS for m in t.measured)
        assert len(t.step_cost.ks) == MAX_SPECULATIVE_TOKENS + 1
        assert len(t.recommended_schedule or []) == MAX_TUNING_ROWS
        assert len(t.reason) == MAX_STATUS_TEXT and not t.reason.endswith(SUMMARISED_NOTE)
    for pool in rest:
        t = pool.tuning
        assert t is not None
        # the report is left out; the state the operator reads back is kept
        assert t.measured == [] and t.estimates == [] and t.step_cost is None
        assert t.capacity is None and t.recommended_schedule is None
        assert t.trial is not None and len(t.trials) == MAX_TRIAL_HISTORY
        assert t.tuned_k is not None and t.recommended_k is not None
        assert t.reason.endswith(SUMMARISED_NOTE) and len(t.reason) <= MAX_STATUS_TEXT
    pool = status.pools[0]
    assert len(pool.reason) == MAX_STATUS_TEXT and pool.reason.endswith("…")
    assert pool.rollback_k is not None and pool.last_alert_time == TIME  # state untouched
    assert len(status.conditions) == MAX_CONDITIONS
    assert all(len(c.message) <= MAX_CONDITION_MESSAGE for c in status.conditions)
    assert len(status.rollbacks) == MAX_ROLLBACK_HISTORY
    assert len(status.fit) == MAX_FIT_ENTRIES
    assert len(status.removed_pools) == MAX_REMOVED_POOLS
    assert all(len(s or "") <= MAX_SUMMARY for s in
               (status.pools_summary, status.tuning_summary, status.fit_summary, status.ready))


def test_bounding_is_stable_so_it_causes_no_writes() -> None:
    once = bounded(worst_case_status())
    assert not status_changed(once, bounded(once))
    assert to_wire(bounded(once)) == to_wire(once)


def test_a_status_within_the_bounds_is_left_as_it_is() -> None:
    """Every status of today's size (the golden and reconciler tests' statuses) is unchanged,
    so nothing is written because of the bound."""
    small = MTPInferenceStatus.model_validate({
        "phase": "Ready",
        "pools": [{"gpuProduct": "NVIDIA-H100-80GB-HBM3", "numSpeculativeTokens": 6,
                   "source": "profile", "deployment": "res-h100", "reason": "profile table",
                   "tuning": {"mode": "Recommend", "reason": "measuring",
                              "measured": [], "trials": []}}],
        "poolsSummary": "H100:6",
    })
    assert to_wire(bounded(small)) == to_wire(small)


T0 = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)


def _classes(n: int) -> list[dict]:
    return [{"name": f"c{i}", "header": {"name": "x-mtp-class", "value": f"c{i}"}}
            for i in range(n)]


def _nodes(products: int) -> list[GPUNode]:
    return [GPUNode(f"n{i}", f"PRODUCT-{i:03d}", 8, {}, True, 8) for i in range(products)]


def test_more_pools_than_the_cap_are_refused_naming_the_field_and_the_limit() -> None:
    per_class = MAX_STATUS_POOLS // MAX_CLASSES
    spec = MTPInferenceSpec.model_validate(
        {"model": "org/m", "speculative": {"classes": _classes(MAX_CLASSES)}})
    at_cap = plan_pass(spec, [], _nodes(per_class), MTPInferenceStatus(), {"generation": 1},
                       {}, T0)
    assert at_cap.problems == [] and len(at_cap.pools) == MAX_STATUS_POOLS
    over = plan_pass(spec, [], _nodes(per_class + 1), MTPInferenceStatus(),
                     {"generation": 1}, {}, T0)
    ((field, message),) = over.problems
    assert field == "gpuProducts"
    assert message.startswith(
        f"{(per_class + 1) * MAX_CLASSES} pools ({per_class + 1} GPU products x {MAX_CLASSES} "
        f"traffic classes): over the limit of {MAX_STATUS_POOLS} a resource")
    assert over.problem_reason == "InvalidSpec"
    # without classes a pool is a product
    plain = MTPInferenceSpec.model_validate({"model": "org/m"})
    over = plan_pass(plain, [], _nodes(MAX_STATUS_POOLS + 1), MTPInferenceStatus(),
                     {"generation": 1}, {}, T0)
    ((field, message),) = over.problems
    assert field == "gpuProducts" and f"over the limit of {MAX_STATUS_POOLS}" in message


def _published(reason: str, updated: str) -> PoolTuningStatus:
    return PoolTuningStatus.model_validate({
        "mode": "Recommend", "reason": reason, "recommendedK": 3, "generation": 1,
        "updated": updated,
        "measured": [{"k": 3, "outputTokensPerSecond": 50.0, "acceptance": [0.8, 0.7, 0.6],
                      "tokensPerStep": 3.1, "windowSeconds": 300.0,
                      "windowEnd": "2026-12-06T05:00:00Z", "replicas": 2}],
        "estimates": [{"k": 3, "basis": "measured", "detail": "d"}],
    })


@pytest.mark.parametrize("full", [True, False])
def test_a_window_that_changes_nothing_but_what_the_bound_leaves_out_writes_nothing(
    full: bool,
) -> None:
    """The tuner keeps `updated` when a window changes nothing (no status write); what the
    status holds is the bounded entry, so the comparison is with the entry as bounded: a
    summarised pool's report, or a reason longer than the cap, is no change."""
    reason = "r" * (2 * MAX_STATUS_TEXT)
    stored = bounded_tuning(_published(reason, "2026-12-06T05:00:00Z"), full)
    again = _published(reason, "2026-12-06T05:05:00Z")
    assert stamped(again, stored).updated == "2026-12-06T05:00:00Z"
    moved = _published(reason + "!", "2026-12-06T05:05:00Z")  # cut away too: no change
    assert stamped(moved, stored).updated == "2026-12-06T05:00:00Z"
    other = _published("another reason", "2026-12-06T05:05:00Z")
    assert stamped(other, stored).updated == "2026-12-06T05:05:00Z"
