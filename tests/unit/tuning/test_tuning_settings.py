"""spec.speculative.tuning: defaults, the decision's Policy, and the checks the schema can't do."""

from __future__ import annotations

from pathlib import Path

import yaml

from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.tuning.settings import default_candidates, policy_for, tuning_problems
from mtp_operator.validation import spec_problems


def spec(**speculative):
    return MTPInferenceSpec.model_validate({"model": "m", "speculative": speculative})


def test_defaults():
    s = spec()
    assert s.speculative.tuning.mode == "Off"
    p = policy_for(s)
    assert p.mode == "Off" and p.min_gain == 0.05 and p.observation_seconds == 300.0
    assert p.max_trials_per_day == 4
    assert p.revisit_seconds == 6 * 3600.0
    assert policy_for(spec(tuning={"revisitSeconds": 0})).revisit_seconds == 0.0
    assert p.trial_windows == 3
    assert policy_for(spec(tuning={"trialWindows": 1})).trial_windows == 1
    assert p.candidates == (0, 1, 2, 3, 4, 5, 6)  # the profile table's deepest K is 6


def test_candidates_follow_the_cap_and_the_mtp_depth():
    assert default_candidates(spec(maxSpeculativeTokens=4)) == (0, 1, 2, 3, 4)
    # vLLM refuses K above n_predict unless a multiple of it: 3 and 5 go with mtpLayers 2
    assert default_candidates(spec(mtpLayers=2)) == (0, 1, 2, 4, 6)
    p = policy_for(spec(tuning={"mode": "Auto", "candidates": [3, 1, 0]}))
    assert p.mode == "Auto" and p.candidates == (0, 1, 3)


def test_problems_name_the_field():
    found = tuning_problems(spec(mtpLayers=2, tuning={"mode": "Auto", "candidates": [0, 3]}))
    assert found == [("speculative.tuning.candidates",
                      "3: vLLM needs K above mtpLayers 2 to be a multiple of it")]
    found = tuning_problems(spec(maxSpeculativeTokens=2, tuning={"candidates": [1, 4]}))
    assert found == [("speculative.tuning.candidates",
                      "4 exceeds speculative.maxSpeculativeTokens 2")]
    assert tuning_problems(spec(tuning={"mode": "Recommend", "candidates": []})) == [
        ("speculative.tuning.candidates", "must list at least one K to tune")]
    assert tuning_problems(spec(tuning={"mode": "Auto"})) == []


def test_spec_problems_reports_bad_tuning_fields():
    _, found = spec_problems({"model": "m", "speculative": {"tuning": {"mode": "Sometimes"}}})
    assert found and found[0][0] == "speculative.tuning.mode"
    _, found = spec_problems({"model": "m", "speculative": {"tuning": {"minGain": 2}}})
    assert found and found[0][0] == "speculative.tuning.minGain"
    _, found = spec_problems(
        {"model": "m", "speculative": {"mtpLayers": 2, "tuning": {"candidates": [5]}}}
    )
    assert found == [("speculative.tuning.candidates",
                      "5: vLLM needs K above mtpLayers 2 to be a multiple of it")]


def test_a_tuned_k_plans_the_pool_and_a_rollback_still_wins():
    from mtp_operator.planning import plan_pool

    s = spec(tuning={"mode": "Auto"})
    plan = plan_pool(s, "NVIDIA-H100-80GB-HBM3", tuned_k=2)
    assert (plan.k, plan.source, plan.k_mode) == (2, "tuned", "fixed")
    assert plan.serve.num_speculative_tokens == 2
    plan = plan_pool(s, "NVIDIA-H100-80GB-HBM3", rollback_k=1, tuned_k=2)
    assert (plan.k, plan.source) == (1, "rollback")
    plan = plan_pool(s, "NVIDIA-H100-80GB-HBM3", tuned_k=6)  # the profile's own K
    assert (plan.k, plan.source) == (6, "profile")


def test_tuning_summary_in_status():
    from mtp_operator.api.v1alpha1 import PoolStatus
    from mtp_operator.status import tuning_summary

    def pool(product, tuning):
        return PoolStatus.model_validate({"gpuProduct": product, "numSpeculativeTokens": 4,
                                          "source": "profile", "deployment": "d",
                                          "tuning": tuning})

    pools = [pool("NVIDIA-H100-80GB-HBM3", {"mode": "Recommend", "recommendedK": 4}),
             pool("NVIDIA-A100-SXM4-80GB", {"mode": "Recommend"}),
             pool("NVIDIA-L40S", None)]
    assert tuning_summary(pools) == "H100:4 A100:-"
    assert tuning_summary(pools[2:]) is None


def test_tuning_state_is_kept_for_its_generation_only_and_folded_in():
    from mtp_operator.api.tuning import PoolTuningStatus
    from mtp_operator.api.v1alpha1 import MTPInferenceStatus
    from mtp_operator.tuning.state import carried, planned_k, with_tuning

    status = MTPInferenceStatus.model_validate({"pools": [
        {"gpuProduct": "A", "numSpeculativeTokens": 4, "source": "profile", "deployment": "a",
         "tuning": {"mode": "Auto", "tunedK": 2, "generation": 3}},
        {"gpuProduct": "B", "numSpeculativeTokens": 4, "source": "profile", "deployment": "b",
         "tuning": {"mode": "Auto", "tunedK": 1, "generation": 2}},
    ]})
    auto = spec(tuning={"mode": "Auto"})
    kept = carried(status, auto, 3)
    assert set(kept) == {"A"} and planned_k(kept["A"]) == 2  # B's is from generation 2
    assert carried(status, spec(), 3) == {}  # tuning off: nothing kept
    new = PoolTuningStatus.model_validate({"mode": "Auto", "generation": 3,
                                           "trial": {"k": 6, "fromK": 2, "kind": "pool",
                                                     "started": "2026-12-01T08:00:00Z"}})
    folded = with_tuning(status, {"B": new})
    assert folded.pools[1].tuning == new and folded.pools[0] == status.pools[0]
    assert planned_k(new) == 6  # a whole-pool trial runs the pool at the trial K


def test_a_trial_waits_as_long_as_the_pool_pods_startup_probe_allows():
    """The start-up allowance is the startup probe of the rendered pool pod (a golden file)."""
    golden = Path(__file__).resolve().parents[2] / "fixtures" / "golden"
    path = sorted(golden.glob("*/*.yaml"))[0]
    dep = next(d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Deployment")
    (vllm,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    probe = vllm["startupProbe"]
    assert policy_for(spec()).startup_seconds == probe["periodSeconds"] * probe["failureThreshold"]


def test_candidates_stop_where_k_stops():
    """Issue 36: K is 0..16 (MAX_SPECULATIVE_TOKENS), so are the candidates, and a set of
    them has at most the 17 values 0..16; the schema, validation and the planner agree."""
    _, found = spec_problems({"model": "m", "speculative": {"tuning": {"candidates": [2, 17]}}})
    assert [f for f, _ in found] == ["speculative.tuning.candidates[1]"]
    _, found = spec_problems(
        {"model": "m", "speculative": {"tuning": {"candidates": [*range(17), 3]}}})
    assert [f for f, _ in found] == ["speculative.tuning.candidates"]
    every = spec(tuning={"mode": "Auto", "candidates": list(range(17))})
    assert tuning_problems(every) == []
    assert policy_for(every).candidates == tuple(range(17))
    # a spec that skipped the schema (built in code): checked, and never planned past 16
    t = every.speculative.tuning.model_copy(update={"candidates": [0, 2, 40]})
    odd = every.model_copy(
        update={"speculative": every.speculative.model_copy(update={"tuning": t})})
    assert tuning_problems(odd) == [("speculative.tuning.candidates", "40 exceeds 16, the most "
                                     "speculative tokens the operator runs")]
    assert policy_for(odd).candidates == (0, 2)
