"""control/evaluator.py: ticks of the built-in evaluator with a frozen clock, scraping fake
vLLM servers (tests/support/fake_vllm.py, vLLM 0.33.0's exposition) over real HTTP on
loopback pod IPs, acting through the real rollback actions on an in-memory cluster."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mtp_operator.adapters.scrape import scrape_client
from mtp_operator.control.evaluator import Evaluator
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.control.rollback import RollbackActions
from mtp_operator.naming import ANNOTATION_COMMAND
from mtp_operator.settings import OperatorSettings
from mtp_runtime.vllm_command import DEFAULT_PORT
from support.fake_cluster import FakeKube, FakeView, mtpinference, node
from support.fake_vllm import FakeVLLM

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
KEY = ("ml", "res")
SPEC = {
    "model": "org/model",
    "tensorParallelSize": 8,
    "rollback": {"windowSeconds": 60, "forSeconds": 30, "minDrafts": 50},
}


def k_of(deployment: dict[str, Any]) -> int:
    argv = json.loads(deployment["metadata"]["annotations"][ANNOTATION_COMMAND])
    return json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]


@pytest.fixture
async def setup():
    """A resource with H100 (K 6) and L40S (K 2) pools, one Ready pod each, whose fake vLLM
    listens on the pod's IP (a free loopback address) at vLLM's port."""
    clock_now = [T0]
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100), node("l1", L40S)])
    view.add(mtpinference("res", SPEC))
    reconciler = Reconciler(kube, view, OperatorSettings(), clock=lambda: clock_now[0])
    await reconciler.reconcile(KEY)
    view.deliver(kube, ready=True)
    await reconciler.reconcile(KEY)
    view.deliver(kube, ready=True)
    actions = RollbackActions(kube, view, reconciler, clock=lambda: clock_now[0])
    base = random.Random().randrange(1, 250)
    fakes: dict[str, FakeVLLM] = {}
    for i, (product, k) in enumerate(((H100, 6), (L40S, 2))):
        ip = f"127.99.{base}.{10 + i}"
        fakes[product] = FakeVLLM(k=k, host=ip, port=DEFAULT_PORT, seed=i).start()
        view.pods[(KEY, product)] = {f"pod-{i}": ip}
    try:
        yield kube, view, actions, fakes, clock_now
    finally:
        for fake in fakes.values():
            fake.stop()


async def test_a_low_hit_rate_held_for_long_enough_rolls_that_pool_back(setup) -> None:
    kube, _view, actions, fakes, clock_now = setup
    evaluator = Evaluator(actions)
    async with scrape_client() as session:

        async def tick(seconds: int) -> int:
            clock_now[0] = T0 + timedelta(seconds=seconds)
            return await evaluator.tick(session, clock_now[0])

        assert await tick(0) == 0  # the first scrape is the window's baseline
        # every 10 s: 100 drafts per pool; H100 accepts its first token 60 % of the time
        # (hit rate 0.6 < 0.88), L40S 95 % (healthy)
        for t in (10, 20, 30):
            fakes[H100].advance([1] * 60 + [0] * 40)
            fakes[L40S].advance([2] * 95 + [0] * 5)
            assert await tick(t) == 0  # crossing since t=10, not yet for forSeconds=30
        fakes[H100].advance([1] * 60 + [0] * 40)
        fakes[L40S].advance([2] * 95 + [0] * 5)
        # both H100 alerts fire: hit rate 0.6, and error propagation (5·D - A + c5)/(6·D) with
        # A = 0.6·D, c5 = 0: 4.4/6 ≈ 0.73 > 0.40; one rollback, the second is in its cooldown
        assert await tick(40) == 2
    assert {p: k_of(d) for p, d in kube.deployments().items()} == {H100: 5, L40S: 2}
    assert len(kube.statuses[KEY]["rollbacks"]) == 1
    record = kube.statuses[KEY]["rollbacks"][-1]
    assert (record["alert"], record["via"], record["fromK"], record["toK"]) == (
        "MTPHitRateLow",
        "evaluator",
        6,
        5,
    )
    assert record["value"] == pytest.approx(0.6)  # c0/D over the window, from raw counters
    assert record["time"] == "2026-11-29T12:00:40Z"  # the frozen clock's


async def test_too_few_drafts_is_no_data_and_an_unreachable_pod_is_skipped(setup) -> None:
    kube, _view, actions, fakes, clock_now = setup
    fakes[L40S].stop()
    evaluator = Evaluator(actions)
    async with scrape_client() as session:
        for t in range(0, 120, 10):
            fakes[H100].advance([0] * 4)  # hit rate 0, but 4 drafts per 10 s < minDrafts 50
            clock_now[0] = T0 + timedelta(seconds=t)
            assert await evaluator.tick(session, clock_now[0]) == 0
    assert k_of(kube.deployments()[H100]) == 6
    assert "rollbacks" not in kube.statuses[KEY] or kube.statuses[KEY]["rollbacks"] == []
