"""A batch-size schedule with data parallelism > 1 (issue 36): vLLM 0.33 drops
num_speculative_tokens_per_batch_size when data_parallel_size > 1
(VllmConfig._maybe_disable_dynamic_sd_for_data_parallel, config/vllm.py: ranks could pick
different K and deadlock) and runs the static num_speculative_tokens. The flags are reserved
in extraArgs; VLLM_DP_SIZE in env (ParallelConfig's fallback, config/parallel.py) is the way
left, so the spec is refused naming the schedule field."""

from __future__ import annotations

import pytest

from mtp_operator.validation import spec_problems

pytestmark = pytest.mark.unit

SCHEDULE = [{"minBatchSize": 1, "maxBatchSize": 8, "numSpeculativeTokens": 3},
            {"minBatchSize": 9, "maxBatchSize": 1024, "numSpeculativeTokens": 1}]


def spec(env: list[dict] | None = None, schedule: list | None = SCHEDULE) -> dict:
    s: dict = {"model": "org/model", "speculative": {"numSpeculativeTokens": 3}}
    if schedule is not None:
        s["speculative"]["batchSizeSchedule"] = schedule
    if env is not None:
        s["env"] = env
    return s


def test_a_schedule_with_vllm_dp_size_over_1_is_refused_naming_the_field() -> None:
    _spec, problems = spec_problems(spec([{"name": "VLLM_DP_SIZE", "value": "2"}]))
    fields = {p.field: p.message for p in problems}
    assert "speculative.batchSizeSchedule" in fields, problems
    message = fields["speculative.batchSizeSchedule"]
    assert "VLLM_DP_SIZE=2" in message and "env[0]" in message and "static" in message


@pytest.mark.parametrize("env, schedule", [
    ([{"name": "VLLM_DP_SIZE", "value": "1"}], SCHEDULE),
    ([{"name": "VLLM_DP_SIZE", "value": "2"}], None),
    ([{"name": "OTHER", "value": "2"}], SCHEDULE),
    (None, SCHEDULE),
])
def test_no_problem_without_both(env, schedule) -> None:
    _spec, problems = spec_problems(spec(env, schedule))
    assert not [p for p in problems if p.field == "speculative.batchSizeSchedule"], problems
