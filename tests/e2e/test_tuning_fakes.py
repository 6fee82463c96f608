"""Measured K through the real operator on the sandbox, pool pods served by vLLM-shaped fakes.

kwok runs no vLLM, so `PoolFakes` serves vLLM 0.33.0's counters on each pool pod's IP. Here a
test thread also sets each pool's draft rate from the K its pods run, as a step cost would:
drafts/s = SCALE / (BASE + PER_TOKEN * K). With per-position acceptance p the output per
replica is then (1 + p + ... + p^(K-1)) drafts-worth per step: the best K follows from the
numbers below by hand (K=1: 1/0.018 = 55.6 steps/s x 1.8 tokens = 100 tok/s; K=2: 38.5 x 2.44
= 93.8; K=3: 29.4 x 2.95 = 86.8; K=4: 23.8 x 3.36 = 80.0 at SCALE 1). The real engines'
proof is bench/tuning/tuning.py; this checks the operator's loop: status, Events, planning, GitOps.
"""

from __future__ import annotations

import time

from support.cluster_fixtures import wait_for
from support.mtpi import H100, apply, deployments, events, pool, resource, wait_ready
from support.pool_fakes import PoolFakes, deployment_k

INTERVAL = 1  # --evaluator-interval: the tuner scrapes as often
WINDOW = 5  # observationSeconds
P = 0.8
BASE, PER_TOKEN, SCALE = 0.010, 0.008, 2.0


def rate(k: int) -> float:
    return SCALE / (BASE + PER_TOKEN * k)


def tps(k: int) -> float:
    return rate(k) * (1 + sum(P**j for j in range(1, k + 1)))


class StepCost:
    """Gives every fake of the resource's pools the draft rate of its own K: rate(K)."""

    def __init__(self, fakes: PoolFakes, name: str) -> None:
        self.fakes, self.name = fakes, name

    def __enter__(self) -> StepCost:
        self.fakes.set_rate((self.name, H100), rate)
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def spec(mode: str, **tuning):
    return {
        "gpuProducts": [H100],
        "speculative": {
            "mtpLayers": 1,
            "maxSpeculativeTokens": 4,
            "tuning": {"mode": mode, "observationSeconds": WINDOW, "candidates": [1, 2, 3, 4],
                       **tuning},
        },
    }


def tuning_of(kubectl, namespace, name):
    return pool(resource(kubectl, namespace, name), H100).get("tuning") or {}


def test_recommend_measures_and_publishes_and_changes_nothing(
    kubeconfig, kubectl, namespace, start_operator
):
    start_operator("--namespace", namespace, "--evaluator-interval", str(INTERVAL))
    apply(kubectl, namespace, "rec", replicas=2, **spec("Recommend"))
    obj = wait_ready(kubectl, namespace, "rec")
    assert pool(obj, H100)["numSpeculativeTokens"] == 4
    generation = obj["metadata"]["generation"]
    before = deployments(kubectl, namespace, "rec")[H100]["metadata"]["annotations"]
    with PoolFakes(kubeconfig, namespace, default_acceptance=P) as fakes, StepCost(fakes, "rec"):
        fakes.wait_serving({H100: 4}, resource="rec")
        t = wait_for(lambda: (x := tuning_of(kubectl, namespace, "rec")).get("measured") and x,
                     4 * WINDOW + 20, message="a measured window in status")
        row = t["measured"][-1]
        assert row["k"] == 4 and row["replicas"] == 2
        # per replica: drafts/s from the step cost, tokens per draft step 1 + A/D
        assert abs(row["outputTokensPerSecond"] / tps(4) - 1) < 0.15, row
        assert abs(row["acceptance"][0] - P) < 0.06 and len(row["acceptance"]) == 4
        assert t["mode"] == "Recommend" and t["recommendedK"] == 4
        assert "K=4" in t["reason"]
        by_k = {e["k"]: e for e in t["estimates"]}
        assert by_k[4]["basis"] == "measured"
        # one K measured: no step-cost line, smaller K only have exact tokens per step
        assert by_k[2]["basis"] == "none" and "two K" in by_k[2]["detail"]
        assert abs(by_k[2]["tokensPerStep"] - (1 + P + P * P)) < 0.1
        obj = resource(kubectl, namespace, "rec")
        assert obj["status"]["tuningSummary"] == "H100:4"
        table = kubectl("get", "mtpi", "rec", "-n", namespace).stdout
        assert "RECOMMENDED" in table.splitlines()[0] and "H100:4" in table
        assert events(kubectl, namespace, "TuningRecommended", "rec")
    # Recommend changed nothing: same K, same Deployment settings, spec untouched
    obj = resource(kubectl, namespace, "rec")
    assert pool(obj, H100)["numSpeculativeTokens"] == 4 and pool(obj, H100)["source"] == "cap"
    assert deployments(kubectl, namespace, "rec")[H100]["metadata"]["annotations"] == before
    assert obj["metadata"]["generation"] == generation
    assert not events(kubectl, namespace, "TuningTrialStarted", "rec")


def test_auto_one_replica_trials_the_pool_adopts_and_a_new_generation_starts_over(
    kubeconfig, kubectl, namespace, start_operator
):
    start_operator("--namespace", namespace, "--evaluator-interval", str(INTERVAL))
    apply(kubectl, namespace, "auto", replicas=1, **spec("Auto"))
    obj = wait_ready(kubectl, namespace, "auto")
    generation, spec_before = obj["metadata"]["generation"], obj["spec"]
    assert max(range(1, 5), key=tps) == 1
    with PoolFakes(kubeconfig, namespace, default_acceptance=P) as fakes, StepCost(fakes, "auto"):
        fakes.wait_serving({H100: 4}, resource="auto")
        # first trial: K=1, the farthest from the measured 4 (a second point for the line),
        # whole pool (1 replica); +25 % over K=4: adopted
        try:
            t = wait_for(lambda: (x := tuning_of(kubectl, namespace, "auto")).get(
                "tunedK") == 1 and x, 12 * WINDOW + 30, interval=1, message="K=1 adopted")
        except TimeoutError as err:
            raise AssertionError(f"{err}: {tuning_of(kubectl, namespace, 'auto')}") from err
        (first, *_) = t["trials"]
        assert (first["k"], first["fromK"], first["kind"], first["outcome"]) == (
            1, 4, "pool", "adopted")
        obj = resource(kubectl, namespace, "auto")
        assert pool(obj, H100)["numSpeculativeTokens"] == 1
        assert pool(obj, H100)["source"] == "tuned"
        fakes.wait_serving({H100: 1}, resource="auto", timeout=30)
        assert deployment_k(deployments(kubectl, namespace, "auto")[H100]) == 1
        assert events(kubectl, namespace, "TuningTrialStarted", "auto")
        assert events(kubectl, namespace, "TuningAdopted", "auto")
        # stays: K=2 and 3 are estimated below K=1 from the line through K=1 and K=4
        time.sleep(3 * WINDOW)
        t = tuning_of(kubectl, namespace, "auto")
        assert t["tunedK"] == 1 and "trial" not in t, t
        assert t["stepCost"]["ks"] == [1, 4]
        assert obj["spec"] == spec_before and obj["metadata"]["generation"] == generation

    # a new spec generation starts over from the spec's K
    apply(kubectl, namespace, "auto", replicas=1, **spec("Auto", minGain=0.06))
    obj = wait_for(lambda: (o := resource(kubectl, namespace, "auto")) and pool(
        o, H100)["numSpeculativeTokens"] == 4 and o, 30, message="back to the spec's K")
    assert pool(obj, H100)["source"] == "cap"
    assert not (pool(obj, H100).get("tuning") or {}).get("tunedK")


def test_auto_canary_beside_the_pool_same_window_then_adopted(
    kubeconfig, kubectl, namespace, start_operator
):
    start_operator("--namespace", namespace, "--evaluator-interval", str(INTERVAL))
    apply(kubectl, namespace, "can", replicas=2, **spec("Auto"))
    wait_ready(kubectl, namespace, "can")
    with PoolFakes(kubeconfig, namespace, default_acceptance=P) as fakes, StepCost(fakes, "can"):
        fakes.wait_serving({H100: 4}, resource="can")
        # the canary: one pod at K=1 beside both replicas of the Deployment at K=4 (issue 37:
        # the sandbox's H100 nodes have GPUs no pool requests, so the trial costs no replica)
        served = wait_for(lambda: (s := fakes.serving("can").get(H100) or []) and sorted(
            x.k for x in s) == [1, 4, 4] and s, 6 * WINDOW + 30, interval=0.5,
            message="a canary at K=1 beside the full pool")
        assert any("canary-k1" in x.pod for x in served)
        dep = deployments(kubectl, namespace, "can")[H100]
        assert dep["spec"]["replicas"] == 2 and deployment_k(dep) == 4
        t = tuning_of(kubectl, namespace, "can")
        assert t["trial"]["kind"] == "canary" and t["trial"]["k"] == 1
        assert t["trial"]["besidePool"] is True, t["trial"]
        assert t["trial"]["capacityCost"].startswith("none: the canary runs on a spare slot")
        # judged over three windows (the default trialWindows) against the K=4 replica: +25 %,
        # adopted by the whole pool
        t = wait_for(lambda: (x := tuning_of(kubectl, namespace, "can")).get("tunedK") == 1
                     and x, 6 * WINDOW + 30, interval=1, message="K=1 adopted")
        assert t["trials"][0]["kind"] == "canary" and "same window" in t["trials"][0]["reason"]
        fakes.wait_serving({H100: 1}, resource="can", timeout=60)
        dep = deployments(kubectl, namespace, "can")[H100]
        assert dep["spec"]["replicas"] == 2 and deployment_k(dep) == 1
        wait_for(lambda: not [p for p in kubectl("get", "pods", "-n", namespace, "-o", "name")
                              .stdout.split() if "canary" in p], 30, message="canary deleted")
