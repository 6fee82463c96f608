"""A resource's spec is parsed once a version, in one place (issue 40): the reconciler's slot
memo (control/slots.Memos, read through Reconciler.spec_of) serves the pass, the built-in
evaluator and the tuner, so a round of either loop parses no spec it has seen."""

from __future__ import annotations

import copy
import json
import sys
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from mtp_operator import validation
from mtp_operator.adapters.scrape import scrape_client
from mtp_operator.control.evaluator import Evaluator
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.control.rollback import RollbackActions
from mtp_operator.control.tuner import Tuner
from mtp_operator.settings import OperatorSettings
from support.fake_cluster import FakeKube, FakeView, mtpinference, node

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
KEY = ("ml", "res")
SPEC = {"model": "org/model", "tensorParallelSize": 8, "replicas": 1,
        "rollback": {"windowSeconds": 60, "forSeconds": 30},
        "speculative": {"maxSpeculativeTokens": 4, "tuning": {
            "mode": "Recommend", "observationSeconds": 10}}}


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every spec_problems call of the operator's control layer (wherever it was imported
    from validation), as the spec's JSON."""
    calls: list[str] = []
    real = validation.spec_problems

    def counting(raw):
        calls.append(json.dumps(raw, sort_keys=True))
        return real(raw)

    monkeypatch.setattr(validation, "spec_problems", counting)
    for name, module in list(sys.modules.items()):
        if name.startswith("mtp_operator.control") and hasattr(module, "spec_problems"):
            monkeypatch.setattr(module, "spec_problems", counting)
    return calls


async def test_the_evaluator_and_the_tuner_parse_a_spec_once_a_version(monkeypatch) -> None:
    calls = count_parses(monkeypatch)
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100)])
    view.add(mtpinference("res", SPEC))
    reconciler = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)
    await reconciler.reconcile(KEY)
    view.deliver(kube, ready=True)
    assert len(calls) == 1  # the pass
    evaluator = Evaluator(RollbackActions(kube, view, reconciler, clock=lambda: T0))
    tuner = Tuner(reconciler, view, kube)

    async def rounds(n: int) -> None:
        async with scrape_client() as client, aiohttp.ClientSession() as session:
            for i in range(n):
                now = T0 + timedelta(seconds=5 * i)
                await evaluator.tick(client, now)
                await tuner.tick(session, now)

    await rounds(3)
    assert len(calls) == 1  # each loop read the pass's parse, every round

    # a new body (a watch event: the status, a new resourceVersion) with the same spec
    body = copy.deepcopy(view.resources[KEY])
    body["metadata"]["resourceVersion"] = "1000"
    view.resources[KEY] = body
    await rounds(2)
    await reconciler.reconcile(KEY)
    assert len(calls) == 1

    # a new spec: parsed once, by whichever reads it first
    body = copy.deepcopy(body)
    body["spec"]["replicas"] = 2
    body["metadata"].update(generation=2, resourceVersion="1001")
    view.resources[KEY] = body
    await rounds(2)
    await reconciler.reconcile(KEY)
    await rounds(1)
    assert len(calls) == 2 and '"replicas": 2' in calls[1]
