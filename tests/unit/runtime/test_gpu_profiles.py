"""The GPU profile table and K resolution (mtp_runtime.gpu_profiles, shared with the operator)."""

from __future__ import annotations

import pytest

from mtp_runtime.gpu_profiles import (
    DEFAULT_K,
    DEFAULT_PROFILES,
    KError,
    KRequest,
    base_product,
    default_k,
    normalize_product,
    product_family,
    resolve_k,
    valid_k_for_depth,
)
from mtp_runtime.pool_config import PoolConfig, same_product
from mtp_runtime.vllm_command import ServeSettings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("name", "product"),
    [
        ("NVIDIA H200", "NVIDIA-H200"),
        (" NVIDIA  H100 80GB HBM3 ", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA-L40S", "NVIDIA-L40S"),
        ("Tesla T4", "Tesla-T4"),
    ],
)
def test_normalize_product(name: str, product: str) -> None:
    assert normalize_product(name) == product


@pytest.mark.parametrize(
    ("product", "family"),
    [
        ("NVIDIA-H200", "H200"),
        ("NVIDIA-H100-80GB-HBM3", "H100"),
        ("NVIDIA-A100-SXM4-80GB", "A100"),
        ("A100-SXM4-40GB-MIG-1g.5gb", "A100"),
        ("NVIDIA-H100-80GB-HBM3-SHARED", "H100"),
        ("NVIDIA-L40S", "L40S"),
        ("NVIDIA-L40", "L40"),
        ("Tesla-T4", "T4"),
        ("NVIDIA-GH200-480GB", "GH200"),
        ("NVIDIA-RTX-4090", None),
    ],
)
def test_product_family(product: str, family: str | None) -> None:
    assert product_family(product) == family


def test_field_report_rows() -> None:
    assert default_k("NVIDIA-H100-80GB-HBM3") == 6
    assert default_k("NVIDIA-A100-SXM4-80GB") == 4
    assert default_k("NVIDIA-L40S") == 2
    assert default_k("NVIDIA-RTX-4090") == DEFAULT_K == 3
    assert default_k("NVIDIA-H100-80GB-HBM3", {"H100": 5}) == 5
    assert default_k("NVIDIA-H100-80GB-HBM3", {"NVIDIA H100 80GB HBM3": 4}) == 4
    assert all(p.reason for p in DEFAULT_PROFILES)


def test_resolve_order_and_sources() -> None:
    r = resolve_k("NVIDIA-H200", KRequest())
    assert (r.k, r.source) == (6, "profile")
    r = resolve_k("NVIDIA-H200", KRequest(num_speculative_tokens=2))
    assert (r.k, r.source) == (2, "override")
    r = resolve_k("NVIDIA-H200", KRequest(num_speculative_tokens=0))
    assert (r.k, r.source) == (0, "off")
    r = resolve_k("NVIDIA-H200", KRequest(profiles={"H200": 3}))
    assert (r.k, r.source) == (3, "override")
    r = resolve_k("NVIDIA-H200", KRequest(max_speculative_tokens=4))
    assert (r.k, r.source) == (4, "cap")
    r = resolve_k("NVIDIA-H200", KRequest(mtp_layers=4))  # 6 not a multiple of 4 → 4
    assert (r.k, r.source) == (4, "cap")


def test_invalid_explicit_k_is_a_clear_error() -> None:
    with pytest.raises(KError) as err:
        resolve_k("NVIDIA-H200", KRequest(num_speculative_tokens=3, mtp_layers=2))
    assert err.value.field == "speculative.numSpeculativeTokens"
    assert "multiple of it (2, 4, 6" in str(err.value)
    with pytest.raises(KError, match="exceeds"):
        resolve_k("NVIDIA-H200", KRequest(num_speculative_tokens=5, max_speculative_tokens=4))


def test_valid_k_for_depth() -> None:
    assert valid_k_for_depth(3, 1)
    assert valid_k_for_depth(2, 2) and valid_k_for_depth(4, 2) and not valid_k_for_depth(3, 2)
    assert valid_k_for_depth(1, 2)
    assert valid_k_for_depth(7, None)


def test_same_product_ignores_mig_and_sharing_suffixes() -> None:
    assert base_product("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb") == "NVIDIA-A100-SXM4-40GB"
    assert same_product("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
    assert same_product("NVIDIA H200", "NVIDIA-H200-SHARED")
    assert not same_product("NVIDIA H200", "NVIDIA-H100-80GB-HBM3")


def test_pool_config_round_trip_and_for_gpu() -> None:
    serve = ServeSettings(model="m", num_speculative_tokens=2, mtp_layers=1,
                          extra_args=("--enforce-eager",))
    pc = PoolConfig(serve=serve, gpu_product="NVIDIA-L40S", profiles={"A100": 3})
    again = PoolConfig.from_json(pc.to_json())
    assert again == pc
    s, res = pc.for_gpu("NVIDIA-L40S")
    assert s == serve and res is None
    s, res = pc.for_gpu("NVIDIA-A100-SXM4-80GB")
    assert s.num_speculative_tokens == 3 and res is not None and res.source == "override"
    s, res = pc.for_gpu("NVIDIA-H200")
    assert s.num_speculative_tokens == 6 and res is not None and res.source == "profile"
    fixed = PoolConfig(serve=serve, gpu_product="NVIDIA-L40S", k_mode="fixed")
    assert fixed.for_gpu("NVIDIA-H200") == (serve, None)
