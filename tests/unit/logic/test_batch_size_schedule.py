"""speculative.batchSizeSchedule → vLLM's num_speculative_tokens_per_batch_size."""

from __future__ import annotations

import json

from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.planning import plan_pool
from mtp_operator.validation import spec_problems
from mtp_runtime.pool_config import PoolConfig
from mtp_runtime.vllm_command import ServeSettings, build_argv, problems

H100 = "NVIDIA-H100-80GB-HBM3"
SCHEDULE = [{"minBatchSize": 1, "maxBatchSize": 4, "numSpeculativeTokens": 3},
            {"minBatchSize": 5, "maxBatchSize": 256, "numSpeculativeTokens": 1}]


def spec_config(argv):
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_rendered_into_the_speculative_config():
    spec = MTPInferenceSpec.model_validate(
        {"model": "m", "speculative": {"numSpeculativeTokens": 3, "batchSizeSchedule": SCHEDULE}})
    plan = plan_pool(spec, H100)
    assert spec_config(build_argv(plan.serve)) == {
        "method": "mtp", "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 256, 1]]}
    # the pod's runtime config carries it and reads back equal (and hashable)
    cfg = PoolConfig(serve=plan.serve, gpu_product=H100, k_mode="fixed")
    back = PoolConfig.from_json(cfg.to_json())
    assert back.serve == plan.serve and hash(back.serve) == hash(plan.serve)


def test_no_schedule_leaves_the_command_and_config_as_before():
    s = ServeSettings(model="m", num_speculative_tokens=2)
    assert spec_config(build_argv(s)) == {"method": "mtp", "num_speculative_tokens": 2}
    assert "batch_size_schedule" not in s.to_json()
    cfg = PoolConfig(serve=s, gpu_product=H100, k_mode="fixed")
    assert "batch_size_schedule" not in cfg.to_json()
    # K=0: no speculative config at all, schedule or not
    off = ServeSettings(model="m", num_speculative_tokens=0, batch_size_schedule=((1, 8, 2),))
    assert "--speculative-config" not in build_argv(off)


def test_vllms_rules_named_by_field():
    def found(schedule, depth=None):
        return problems(ServeSettings(model="m", num_speculative_tokens=4, mtp_layers=depth,
                                      batch_size_schedule=schedule))

    assert found(((1, 4, 3), (5, 64, 1))) == []
    assert found(((2, 4, 3),)) == [("speculative.batchSizeSchedule[0]",
                                    "the first range must start at batch 1")]
    assert found(((1, 4, 3), (4, 8, 1))) == [("speculative.batchSizeSchedule[1]",
                                              "ranges must be sorted and must not overlap")]
    assert found(((1, 0, 3),))[0][0] == "speculative.batchSizeSchedule[0]"
    assert found(((1, 8, 3),), depth=2) == [(
        "speculative.batchSizeSchedule[0]", "K=3 must be 0 or more and valid for mtpLayers=2")]
    _, errs = spec_problems({"model": "m", "speculative": {"batchSizeSchedule": [
        {"minBatchSize": 3, "maxBatchSize": 8, "numSpeculativeTokens": 1}]}})
    assert ("speculative.batchSizeSchedule[0]", "the first range must start at batch 1") in errs


def test_not_with_tuning():
    _, errs = spec_problems({"model": "m", "speculative": {
        "batchSizeSchedule": SCHEDULE, "tuning": {"mode": "Recommend"}}})
    assert [f for f, _ in errs] == ["speculative.tuning.mode"]


def test_a_schedule_k_stops_at_16():
    """Issue 36: the schedule's K has the same bound as every other K (0..16)."""
    deep = [{"minBatchSize": 1, "maxBatchSize": 4, "numSpeculativeTokens": 17}]
    _, found = spec_problems({"model": "m", "speculative": {"batchSizeSchedule": deep}})
    assert [f for f, _ in found] == ["speculative.batchSizeSchedule[0].numSpeculativeTokens"]
    ok = [{"minBatchSize": 1, "maxBatchSize": 4, "numSpeculativeTokens": 16}]
    assert spec_problems({"model": "m", "speculative": {"batchSizeSchedule": ok}})[1] == []
    # the runtime's own check (what a pod's config is held to)
    s = ServeSettings(model="m", num_speculative_tokens=16, batch_size_schedule=((1, 4, 17),))
    assert [p.field for p in problems(s)] == ["speculative.batchSizeSchedule[0]"]
