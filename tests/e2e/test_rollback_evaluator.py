"""Automatic rollback through the built-in evaluator, with no Prometheus at all.

The real operator (`--evaluator --evaluator-interval 1`) scrapes the pool pods' vLLM /metrics
on port 8000; kwok pods have loopback IPs, so `PoolFakes` serves vLLM 0.33.0's exact
spec-decode counters on each pod's IP (K from the pod's own MTP_RUNTIME_CONFIG, counters
advanced at 100 drafts/s with a per-position acceptance p we set). Short rollback windows per
resource make the scenario take seconds instead of minutes.
"""

from __future__ import annotations

import time

from support.cluster_fixtures import wait_for
from support.mtpi import (
    ANNOTATION_RESET,
    H100,
    apply,
    check_one_pool_rolled_back,
    condition,
    deployments,
    events,
    pool,
    pool_ks,
    resource,
    settings_hashes,
    wait_ready,
)
from support.pool_fakes import PoolFakes, PoolWatch

INTERVAL = 1  # --evaluator-interval
ROLLBACK = {
    "windowSeconds": 5,
    "forSeconds": 2,
    "minDrafts": 20,
    "cooldownSeconds": 15,
    "stabilizationSeconds": 3,
}
HEALTHY, DEGRADED = 0.95, 0.6


def evaluator_operator(start_operator, namespace):
    return start_operator(
        "--namespace", namespace, "--evaluator", "--evaluator-interval", str(INTERVAL)
    )


def wait_scrapes(fakes: PoolFakes, n: int, timeout: float = 30, **which: str) -> None:
    """Until the evaluator has scraped the chosen fakes `n` more times (its clock, not ours)."""
    start = fakes.scrapes(**which)
    wait_for(lambda: fakes.scrapes(**which) >= start + n, timeout,
             message=f"{n} more evaluator scrapes of {which or 'the fakes'}")


def test_evaluator_rolls_back_only_the_degraded_pool_and_holds_until_reset(
    kubeconfig, kubectl, namespace, start_operator
):
    op = evaluator_operator(start_operator, namespace)
    apply(kubectl, namespace, "dsv3", speculative={"mtpLayers": 1}, rollback=ROLLBACK)
    obj = wait_ready(kubectl, namespace, "dsv3")
    ks = pool_ks(obj)
    assert ks[H100] == 6 and len(ks) == 4, ks
    spec_before, generation = obj["spec"], obj["metadata"]["generation"]

    with PoolWatch(kubeconfig, namespace) as watch, PoolFakes(kubeconfig, namespace) as fakes:
        fakes.wait_serving(ks)
        hashes = settings_hashes(deployments(kubectl, namespace))
        # Healthy traffic on every pool for a few evaluations: nothing happens.
        wait_scrapes(fakes, 3, product=H100)
        assert not watch.since(0), watch.since(0)

        t0 = time.monotonic()
        fakes.set_acceptance(H100, DEGRADED)
        change = watch.wait(lambda c: c.product == H100, after=t0, timeout=40)
        degraded_to_patch = change.t - t0
        fakes.set_acceptance(H100, HEALTHY)  # the K=5 pods serve well
        print(f"\nevaluator: degradation -> H100 Deployment patched in {degraded_to_patch:.2f}s")
        assert change.k == 5
        assert degraded_to_patch < 15

        obj = check_one_pool_rolled_back(kubectl, namespace, "dsv3", H100, ks=ks,
                                         hashes=hashes, to_k=5, via="evaluator",
                                         spec_before=spec_before, generation=generation)
        assert "6->5" in obj["status"]["rollbacks"][0]["reason"]
        assert op.metric("mtp_operator_rollbacks_total") == 1

        # Recovered: no flapping through the cooldown and a few evaluations past it.
        fakes.wait_serving({**ks, H100: 5})
        hold_until = change.t + ROLLBACK["cooldownSeconds"]
        wait_for(lambda: time.monotonic() > hold_until, ROLLBACK["cooldownSeconds"] + 5,
                 interval=0.5, message="cooldown over")
        wait_scrapes(fakes, 3, product=H100)
        assert watch.since(change.t) == [], "pools changed again after the rollback"
        obj = resource(kubectl, namespace, "dsv3")
        assert len(obj["status"]["rollbacks"]) == 1
        assert pool(obj, H100)["numSpeculativeTokens"] == 5
        assert op.metric("mtp_operator_rollbacks_total") == 1

        # Stabilized: K=5 becomes the pool's known-good once a reconcile looks at it (any
        # change to the object makes one; otherwise the 30 s resync does).
        kubectl("annotate", "mtpi", "dsv3", "-n", namespace, "example.com/poke=1")
        obj = wait_for(lambda: (o := resource(kubectl, namespace, "dsv3")) and pool(
            o, H100).get("knownGoodK") == 5 and o, 15, message="knownGoodK=5")
        assert pool(obj, H100)["rollbackK"] == 5

        # Reset: the spec's K comes back for H100 only; the spec itself was never touched.
        t1 = time.monotonic()
        kubectl("annotate", "mtpi", "dsv3", "-n", namespace, f"{ANNOTATION_RESET}=r1")
        back = watch.wait(lambda c: c.product == H100, after=t1, timeout=20)
        assert back.k == 6
        obj = wait_for(lambda: (o := resource(kubectl, namespace, "dsv3"))["status"].get(
            "rollbackResetToken") == "r1" and o, 10, message="reset handled")
        assert pool_ks(obj) == ks
        assert pool(obj, H100)["source"] == "profile" and "rollbackK" not in pool(obj, H100)
        assert condition(obj, "SpeculationRolledBack")["status"] == "False"
        assert settings_hashes(deployments(kubectl, namespace)) == hashes
        assert {c.product for c in watch.since(change.t)} == {H100}
        assert obj["spec"] == spec_before and obj["metadata"]["generation"] == generation


def test_evaluator_leaves_disabled_idle_and_unreachable_pools_alone(
    kubeconfig, kubectl, namespace, start_operator
):
    """Every resource below has a degraded H100 pool; only `control` may be rolled back."""
    op = evaluator_operator(start_operator, namespace)
    h100_only = {"gpuProducts": [H100], "speculative": {"mtpLayers": 1}}
    resources = {
        "control": ROLLBACK,  # degraded, enabled: rolled back (proves the data was there)
        "disabled": {**ROLLBACK, "enabled": False},  # degraded, rollback disabled
        "idle": ROLLBACK,  # vLLM up, no drafts at all: no data
        "trickle": ROLLBACK,  # ~10 drafts per 5 s window, under minDrafts 20: no data
        "down": ROLLBACK,  # /metrics unreachable: no data
    }
    for name, rollback in resources.items():
        apply(kubectl, namespace, name, rollback=rollback, **h100_only)
    for name in resources:
        assert pool_ks(wait_ready(kubectl, namespace, name)) == {H100: 6}

    fakes = PoolFakes(kubeconfig, namespace, acceptance={H100: 0.3})
    fakes.set_rate(("idle", H100), 0)
    fakes.set_rate(("trickle", H100), 2)
    fakes.set_serving(("down", H100), False)
    with PoolWatch(kubeconfig, namespace) as watch, fakes:
        for name in ("control", "disabled", "idle", "trickle"):
            fakes.wait_serving({H100: 6}, resource=name)
        assert not fakes.serving("down")
        change = watch.wait(lambda c: c.product == H100, timeout=40)
        assert (change.resource, change.k) == ("control", 5)
        # A few more evaluations of the silent pools after the control acted.
        wait_scrapes(fakes, 3, resource="idle")
        wait_scrapes(fakes, 3, resource="trickle")

        assert [c.resource for c in watch.since(0)] == ["control"]
        assert op.metric("mtp_operator_rollbacks_total") == 1
        for name in ("disabled", "idle", "trickle", "down"):
            obj = resource(kubectl, namespace, name)
            assert not obj["status"].get("rollbacks"), (name, obj["status"]["rollbacks"])
            assert pool_ks(obj) == {H100: 6}, name
            assert condition(obj, "SpeculationRolledBack")["status"] == "False", name
            assert not events(kubectl, namespace, "SpeculationRolledBack", name), name
        # The disabled resource's pods are not even scraped.
        assert fakes.scrapes(resource="disabled") == 0
