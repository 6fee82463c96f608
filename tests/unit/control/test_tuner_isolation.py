"""One resource's failing write does not stop the tuner's round for the others (issue 36,
defect 4): its error is its own log line and Event; the round goes on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from mtp_operator.control.reconciler import Reconciler, TransientReconcileError
from mtp_operator.control.tuner import Tuner
from mtp_operator.settings import OperatorSettings
from support.fake_cluster import FakeKube, FakeView, mtpinference, node

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"


def spec() -> dict:
    return {"model": "org/model", "tensorParallelSize": 8, "replicas": 1,
            "speculative": {"maxSpeculativeTokens": 4, "tuning": {
                "mode": "Recommend", "observationSeconds": 10}}}


@pytest.mark.parametrize("failing", ["a", "b"])
async def test_a_failing_resource_does_not_stop_the_round(monkeypatch, failing: str) -> None:
    kube = FakeKube()
    view = FakeView(nodes=[node("h1", H100)])
    for name in ("a", "b"):
        view.add(mtpinference(name, spec()))
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    for name in ("a", "b"):
        await rec.reconcile(("ml", name))
    view.deliver(kube, ready=True)
    real = rec.reconcile_locked

    async def reconcile_locked(key, *a, **kw):
        if key == ("ml", failing) and a and a[0].tuning:
            raise TransientReconcileError("422: Deployment.apps is invalid: injected")
        return await real(key, *a, **kw)

    monkeypatch.setattr(rec, "reconcile_locked", reconcile_locked)
    tuner = Tuner(rec, view, kube)
    async with aiohttp.ClientSession() as session:
        await tuner.tick(session, T0)
        decided = await tuner.tick(session, T0 + timedelta(seconds=10))
    other = "b" if failing == "a" else "a"
    assert decided == 2  # both decided; only one could write
    assert "tuning" in kube.statuses[("ml", other)]["pools"][0]
    assert "tuning" not in kube.statuses[("ml", failing)]["pools"][0]
    failed = [(n, m) for n, reason, m, _ in kube.events if reason == "TuningFailed"]
    assert len(failed) == 1 and failed[0][0] == failing
    assert H100 in failed[0][1] and "injected" in failed[0][1]
