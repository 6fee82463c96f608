"""A tuning canary: one pod at the trial K beside the pool's Deployment (which runs one less)."""

from __future__ import annotations

import json

from mtp_operator import builders
from mtp_operator.api.tuning import PoolTuningStatus
from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.naming import LABEL_CANARY, LABEL_OWNER_UID, pool_labels, pool_selector
from mtp_operator.planning import plan_pool
from mtp_operator.tuning.state import canary_plans

H100 = "NVIDIA-H100-80GB-HBM3"


def spec(replicas=3):
    return MTPInferenceSpec.model_validate({
        "model": "m", "replicas": replicas,
        "speculative": {"maxSpeculativeTokens": 4, "tuning": {"mode": "Auto"}},
    })


def tuning(kind="canary", k=2):
    return {H100: PoolTuningStatus.model_validate({
        "mode": "Auto",
        "trial": {"k": k, "fromK": 4, "kind": kind, "started": "2026-12-01T08:00:00Z"}})}


def test_canary_plan_only_for_a_canary_trial_with_two_or_more_replicas():
    s = spec()
    plans = [plan_pool(s, H100)]
    (plan,) = canary_plans(s, plans, tuning(), lambda p: None, {}).values()
    assert (plan.k, plan.source) == (2, "tuned") and plans[0].k == 4
    assert canary_plans(s, plans, tuning("pool"), lambda p: None, {}) == {}
    assert canary_plans(spec(1), plans, tuning(), lambda p: None, {}) == {}
    assert canary_plans(s, plans, {}, lambda p: None, {}) == {}
    # a rolled-back pool runs no canary: rollback wins over tuning (issue 36)
    assert canary_plans(s, plans, tuning(k=3), lambda p: 1, {}) == {}


def test_canary_pod_and_the_pool_beside_it():
    s = spec()
    main = plan_pool(s, H100)
    (canary,) = canary_plans(s, [main], tuning(), lambda p: None, {}).values()
    objs = builders.desired_objects("dsv3", "ml", "uid-1", s, [main], "img", {},
                                    canaries=frozenset({H100}))
    dep = objs[1]
    assert dep["spec"]["replicas"] == 2  # 3 replicas: 2 in the Deployment + the canary
    plain = builders.desired_objects("dsv3", "ml", "uid-1", s, [main], "img", {})[1]
    assert plain["spec"]["replicas"] == 3
    # the pods of both run the same template but for K: only the replicas differ
    assert plain["spec"]["template"] == dep["spec"]["template"]
    pod = builders.canary_pod("dsv3", "ml", "uid-1", s, canary, "img", {})
    assert pod["kind"] == "Pod" and pod["metadata"]["name"] == "dsv3-h100-80gb-hbm3-canary-k2"
    labels = pod["metadata"]["labels"]
    # the pool's labels, the canary mark and the owner's UID (Service membership, issue 36)
    assert labels == {**pool_labels("dsv3", H100), LABEL_CANARY: "true",
                      LABEL_OWNER_UID: "uid-1"}
    # the Service and the Deployment's selector see it as one of the pool's pods
    assert all(labels[k] == v for k, v in pool_selector("dsv3", H100).items())
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert json.loads(env["MTP_RUNTIME_CONFIG"])["serve"]["num_speculative_tokens"] == 2
    argv = json.loads(pod["metadata"]["annotations"]["mtp-operator.io/vllm-command"])
    assert '"num_speculative_tokens":2' in " ".join(argv)
