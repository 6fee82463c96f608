"""control/tuner.py: ticks of the tuner with a frozen clock, scraping fake vLLM servers over
real HTTP on loopback pod IPs, acting through the real reconciler on an in-memory cluster.

The fakes' counters are advanced by the test as a step cost would: per 10 s window, more drafts
at K=1 than at K=4 (250 vs 100), acceptance p=0.8 per position, so K=1 emits 250 x 1.8 = 450
tokens per window and K=4 about 100 x 3.36 = 336: K=1 is about +34 %.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from mtp_operator.control.reconciler import Reconciler
from mtp_operator.control.tuner import Tuner
from mtp_operator.naming import ANNOTATION_COMMAND
from mtp_operator.settings import OperatorSettings
from mtp_runtime.vllm_command import DEFAULT_PORT
from support.fake_cluster import FakeKube, FakeView, mtpinference, node
from support.fake_vllm import FakeVLLM

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
KEY = ("ml", "res")
P = 0.8
DRAFTS = {4: 100, 1: 250}  # per 10 s window


def spec(replicas: int, mode: str = "Auto") -> dict:
    return {"model": "org/model", "tensorParallelSize": 8, "replicas": replicas,
            "speculative": {"maxSpeculativeTokens": 4, "tuning": {
                "mode": mode, "observationSeconds": 10, "candidates": [1, 4],
                # one window judges a trial here: the median of several is decision's tests'
                "trialWindows": 1}}}


def k_of(deployment: dict) -> int:
    argv = json.loads(deployment["metadata"]["annotations"][ANNOTATION_COMMAND])
    return json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]


class Cluster:
    def __init__(self, replicas: int, mode: str = "Auto", nodes: int = 2,
                 **tuning: object) -> None:
        self.now = T0
        self.kube = FakeKube()
        self.view = FakeView(nodes=[node(f"h{i + 1}", H100) for i in range(nodes)])
        body = spec(replicas, mode)
        body["speculative"]["tuning"].update(tuning)
        self.view.add(mtpinference("res", body))
        self.reconciler = Reconciler(self.kube, self.view, OperatorSettings(),
                                     clock=lambda: self.now)
        self.tuner = Tuner(self.reconciler, self.view, self.kube)
        self.base = random.Random().randrange(1, 250)
        self.fakes: dict[str, FakeVLLM] = {}
        self.n = 0

    async def settle(self) -> None:
        for _ in range(2):
            await self.reconciler.reconcile(KEY)
            self.view.deliver(self.kube, ready=True)

    def serve(self, name: str, k: int) -> None:
        """A pod `name` at K with a fake vLLM on its own loopback IP."""
        self.n += 1
        ip = f"127.98.{self.base}.{10 + self.n}"
        self.fakes[name] = FakeVLLM(k=k, host=ip, port=DEFAULT_PORT, seed=self.n).start()
        self.view.pods.setdefault((KEY, H100), {})[name] = ip

    def drop(self, name: str) -> None:
        self.fakes.pop(name).stop()
        del self.view.pods[(KEY, H100)][name]

    def traffic(self) -> None:
        for fake in self.fakes.values():
            fake.advance_random(DRAFTS[fake.k], P)

    async def tick(self, session, seconds: float) -> int:
        self.now = T0 + timedelta(seconds=seconds)
        return await self.tuner.tick(session, self.now)

    def pool(self) -> dict:
        return self.kube.statuses[KEY]["pools"][0]

    def stop(self) -> None:
        for fake in self.fakes.values():
            fake.stop()


async def test_one_replica_trials_the_whole_pool_and_adopts():
    c = Cluster(replicas=1)
    await c.settle()
    c.serve("pod-a", 4)
    try:
        async with aiohttp.ClientSession() as session:
            assert await c.tick(session, 0) == 0  # baseline scrape
            c.traffic()
            assert await c.tick(session, 10) == 1  # a window at K=4: second K for the line
            t = c.pool()["tuning"]
            trial = t["trial"]
            assert (trial["k"], trial["fromK"], trial["kind"], trial["started"]) == (
                1, 4, "pool", "2026-12-01T08:00:10Z")
            assert t["measured"][0]["k"] == 4 and t["measured"][0]["replicas"] == 1
            assert k_of(c.kube.deployments()[H100]) == 1  # the whole pool rolled to K=1
            assert "TuningTrialStarted" in c.kube.reasons()
            # the pod restarts at K=1 (a new pod), serves a window
            c.drop("pod-a")
            c.view.deliver(c.kube, ready=True)
            c.serve("pod-b", 1)
            await c.tick(session, 20)  # pod-b's baseline (pod-a's window is gone)
            c.traffic()
            await c.tick(session, 30)
            pool = c.pool()
            assert pool["tuning"]["tunedK"] == 1 and "trial" not in pool["tuning"]
            (trial,) = pool["tuning"]["trials"]
            assert (trial["outcome"], trial["kind"]) == ("adopted", "pool")
            assert "+3" in trial["reason"]  # +34 %
            assert (pool["numSpeculativeTokens"], pool["source"]) == (1, "tuned")
            assert k_of(c.kube.deployments()[H100]) == 1
            assert "TuningAdopted" in c.kube.reasons()
            assert c.kube.statuses[KEY]["tuningSummary"] == "H100:1"
    finally:
        c.stop()


async def test_canary_beside_two_replicas_same_window_then_deleted():
    c = Cluster(replicas=2)
    await c.settle()
    c.serve("pod-a", 4)
    c.serve("pod-b", 4)
    try:
        async with aiohttp.ClientSession() as session:
            await c.tick(session, 0)
            c.traffic()
            await c.tick(session, 10)
            trial = c.pool()["tuning"]["trial"]
            assert trial["kind"] == "canary" and not trial.get("besidePool")
            # two 8-GPU nodes, two 8-GPU replicas: no spare slot, the pool gives one up
            assert trial["capacityCost"].startswith("1 of 2 replicas")
            assert "no spare slot on NVIDIA-H100-80GB-HBM3 (0 of 16 GPUs" in trial["capacityCost"]
            assert c.kube.deployments()[H100]["spec"]["replicas"] == 1  # one less
            pods = [k for k in c.kube.objects if k[0] == "Pod"]
            assert [p[2] for p in pods] == ["res-h100-80gb-hbm3-canary-k1"]
            # the Deployment drops a replica, the canary comes up beside the other
            c.drop("pod-b")
            c.serve("res-h100-80gb-hbm3-canary-k1", 1)
            await c.tick(session, 20)
            c.traffic()
            await c.tick(session, 30)
            pool = c.pool()
            (trial,) = pool["tuning"]["trials"]
            assert trial["outcome"] == "adopted" and "same window" in trial["reason"]
            assert c.kube.deployments()[H100]["spec"]["replicas"] == 2
            assert k_of(c.kube.deployments()[H100]) == 1
            assert ("delete_pod", "res-h100-80gb-hbm3-canary-k1") in c.kube.calls
    finally:
        c.stop()


async def _canary_started(c: Cluster, session) -> dict:
    await c.settle()
    c.serve("pod-a", 4)
    c.serve("pod-b", 4)
    await c.tick(session, 0)
    c.traffic()
    await c.tick(session, 10)
    trial = c.pool()["tuning"]["trial"]
    assert trial["kind"] == "canary"
    assert [k[2] for k in c.kube.objects if k[0] == "Pod"] == ["res-h100-80gb-hbm3-canary-k1"]
    return trial


async def test_with_a_spare_slot_the_canary_runs_beside_the_full_pool():
    """Issue 37: three 8-GPU nodes, two 8-GPU replicas: the canary takes the spare node and
    the pool keeps both replicas (the trial costs no capacity), to the trial's end, though the
    canary now holds the slot that was spare; the status says so with the numbers."""
    c = Cluster(replicas=2, nodes=3)
    try:
        async with aiohttp.ClientSession() as session:
            trial = await _canary_started(c, session)
            assert trial["besidePool"] is True
            assert trial["capacityCost"].startswith("none: the canary runs on a spare slot")
            assert "8 of 24 GPUs" in trial["capacityCost"]
            assert c.kube.deployments()[H100]["spec"]["replicas"] == 2  # none given up
            c.view.deliver(c.kube, ready=True)  # the canary pod is watched now: no room left
            await c.reconciler.reconcile(KEY)
            assert c.kube.deployments()[H100]["spec"]["replicas"] == 2  # held to its end
            c.serve("res-h100-80gb-hbm3-canary-k1", 1)
            await c.tick(session, 20)
            c.traffic()
            await c.tick(session, 30)
            (ended,) = c.pool()["tuning"]["trials"]
            assert ended["outcome"] == "adopted" and ended["besidePool"] is True
            assert c.kube.deployments()[H100]["spec"]["replicas"] == 2
            assert k_of(c.kube.deployments()[H100]) == 1
            started = [e for e in c.kube.events if e[1] == "TuningTrialStarted"]
            assert started and "capacity cost: none" in started[0][2]
    finally:
        c.stop()


async def test_from_pool_placement_gives_a_replica_up_even_with_a_spare_slot():
    c = Cluster(replicas=2, nodes=3, canaryPlacement="FromPool")
    try:
        async with aiohttp.ClientSession() as session:
            trial = await _canary_started(c, session)
            assert not trial.get("besidePool")
            assert trial["capacityCost"] == (
                "1 of 2 replicas while the canary loads and runs (1 serve): canaryPlacement "
                "FromPool")
            assert c.kube.deployments()[H100]["spec"]["replicas"] == 1
    finally:
        c.stop()


async def test_a_canary_that_serves_too_little_ends_after_its_windows():
    """Issue 37's bench: a canary that is up but gets a trickle (5 drafts a window, so 5
    request-steps of the 50 a window needs) is aborted after three such windows, not after
    the pool's 30 min start-up allowance, and says why."""
    c = Cluster(replicas=2, nodes=3)
    try:
        async with aiohttp.ClientSession() as session:
            await _canary_started(c, session)
            c.serve("res-h100-80gb-hbm3-canary-k1", 1)
            await c.tick(session, 20)  # the canary's first scrape
            canary = c.fakes["res-h100-80gb-hbm3-canary-k1"]
            for i, at in enumerate((30, 40, 50)):
                for fake in c.fakes.values():
                    fake.advance_random(5 if fake is canary else DRAFTS[fake.k], P)
                await c.tick(session, at)
                if i < 2:
                    t = c.pool()["tuning"]
                    assert t["trial"]["k"] == 1
                    assert "its last window held 5 request-steps of the 50" in t["reason"]
            pool = c.pool()
            (ended,) = pool["tuning"]["trials"]
            assert ended["outcome"] == "aborted" and ended["k"] == 1
            assert "3 windows in a row held too few request-steps (the last 5" in ended["reason"]
            assert "observationSeconds than 10 s" in ended["reason"]
            assert k_of(c.kube.deployments()[H100]) == 4  # the pool kept its K
    finally:
        c.stop()


async def test_recommend_changes_nothing():
    c = Cluster(replicas=1, mode="Recommend")
    await c.settle()
    c.serve("pod-a", 4)
    try:
        async with aiohttp.ClientSession() as session:
            await c.tick(session, 0)
            writes = c.kube.count("apply")
            c.traffic()
            await c.tick(session, 10)
            t = c.pool()["tuning"]
            assert t["mode"] == "Recommend" and t["recommendedK"] == 4 and "trial" not in t
            assert c.kube.count("apply") == writes  # no Deployment written
            assert "TuningRecommended" in c.kube.reasons()
    finally:
        c.stop()


@pytest.mark.parametrize("mode", ["Recommend", "Auto"])
async def test_a_window_that_changes_nothing_writes_no_status(mode):
    """Issue 36: `tuning.updated` alone forced a status write per pool per window. A pool whose
    windows bring nothing new (no pod answers: no measurement, the same reason) is written
    once, when its entry first appears; `updated` stays the time of that change."""
    c = Cluster(replicas=1, mode=mode)
    await c.settle()
    async with aiohttp.ClientSession() as session:
        await c.tick(session, 0)
        await c.tick(session, 10)  # the first window: the entry appears
        c.view.deliver(c.kube, ready=True)
        first = c.pool()["tuning"]
        writes = c.kube.count("patch_status")
        for window in range(2, 6):
            await c.tick(session, 10 * window)
            c.view.deliver(c.kube, ready=True)
        assert c.kube.count("patch_status") == writes  # four windows, no write
        assert c.pool()["tuning"] == first
        assert first["updated"] == "2026-12-01T08:00:10Z"
