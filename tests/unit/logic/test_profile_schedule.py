"""A measured GPU profile may carry K per batch-size band; how it reaches a pool's settings."""

from __future__ import annotations

import pytest

from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.planning import plan_pool
from mtp_runtime import gpu_profiles
from mtp_runtime.gpu_profiles import GPUProfile, KRequest, bounded_schedule, resolve_k

BANDS = ((1, 8, 3), (9, 32, 2), (33, 1024, 1))


@pytest.fixture
def measured_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = tuple(
        GPUProfile("H100", 3, "measured: test", BANDS) if p.family == "H100" else p
        for p in gpu_profiles.DEFAULT_PROFILES
    )
    monkeypatch.setattr(gpu_profiles, "DEFAULT_PROFILES", rows)


def test_bounded_schedule_caps_merges_and_collapses() -> None:
    assert bounded_schedule(BANDS, 3, None) == BANDS
    # capped at 2: the first two bands run K=2 and merge
    assert bounded_schedule(BANDS, 2, None) == ((1, 32, 2), (33, 1024, 1))
    # capped at 1: one K everywhere, no schedule needed
    assert bounded_schedule(BANDS, 1, None) == ()
    # depth 2: K=3 is not a multiple of 2 and above it, so it is lowered to 2
    assert bounded_schedule(BANDS, 3, 2) == ((1, 32, 2), (33, 1024, 1))


def test_profile_schedule_resolved_for_its_product(measured_h100: None) -> None:
    r = resolve_k("NVIDIA-H100-80GB-HBM3", KRequest())
    assert (r.k, r.source, r.schedule) == (3, "profile", BANDS)
    assert "measured: test" in r.reason
    # another product has no schedule
    assert resolve_k("NVIDIA-A100-SXM4-80GB", KRequest()).schedule == ()


def test_overrides_and_slices_drop_the_schedule(measured_h100: None) -> None:
    product = "NVIDIA-H100-80GB-HBM3"
    assert resolve_k(product, KRequest(num_speculative_tokens=2)).schedule == ()
    assert resolve_k(product, KRequest(profiles={"H100": 3})).schedule == ()
    assert resolve_k(product, KRequest(), cluster_overrides={"H100": 3}).schedule == ()
    assert resolve_k("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", KRequest()).schedule == ()
    capped = resolve_k(product, KRequest(max_speculative_tokens=2))
    assert (capped.k, capped.schedule) == (2, ((1, 32, 2), (33, 1024, 1)))


def spec(**speculative: object) -> MTPInferenceSpec:
    return MTPInferenceSpec.model_validate({"model": "org/m", "speculative": speculative})


def test_plan_renders_the_schedule_and_a_rollback_caps_it(measured_h100: None) -> None:
    product = "NVIDIA-H100-80GB-HBM3"
    plan = plan_pool(spec(), product)
    assert plan.serve.batch_size_schedule == BANDS
    assert plan.serve.num_speculative_tokens == 3
    rolled = plan_pool(spec(), product, rollback_k=2)
    assert rolled.serve.batch_size_schedule == ((1, 32, 2), (33, 1024, 1))
    assert plan_pool(spec(), product, rollback_k=1).serve.batch_size_schedule == ()


def test_tuned_or_tuning_pools_run_one_k(measured_h100: None) -> None:
    product = "NVIDIA-H100-80GB-HBM3"
    assert plan_pool(spec(), product, tuned_k=2).serve.batch_size_schedule == ()
    tuning = spec(tuning={"mode": "Auto"})
    assert plan_pool(tuning, product).serve.batch_size_schedule == ()


def test_the_spec_schedule_wins(measured_h100: None) -> None:
    own = spec(batchSizeSchedule=[{"minBatchSize": 1, "maxBatchSize": 4, "numSpeculativeTokens": 1},
                                  {"minBatchSize": 5, "maxBatchSize": 64,
                                   "numSpeculativeTokens": 0}])
    assert plan_pool(own, "NVIDIA-H100-80GB-HBM3").serve.batch_size_schedule == ((1, 4, 1),
                                                                                  (5, 64, 0))


def test_data_parallel_pools_run_one_k(measured_h100: None) -> None:
    """vLLM 0.33 drops a schedule when data parallelism > 1: the profile's is not rendered."""
    dp = MTPInferenceSpec.model_validate({"model": "org/m",
                                         "env": [{"name": "VLLM_DP_SIZE", "value": "2"}]})
    plan = plan_pool(dp, "NVIDIA-H100-80GB-HBM3")
    assert plan.serve.batch_size_schedule == () and plan.serve.num_speculative_tokens == 3
