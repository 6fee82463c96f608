"""Names built from a GPU product (the node label `nvidia.com/gpu.product`) are injective:
two products never share a pool Deployment or a canary pod (issue 36)."""

from __future__ import annotations

import itertools
import re

import pytest

from mtp_operator.naming import canary_pod_name, pool_deployment_name, product_slug

DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
HASH_TAIL = re.compile(r"-[0-9a-f]{8}$")


@pytest.mark.parametrize(
    ("product", "name"),
    [
        # GFD's own spelling: today's names stay, so no cluster's Deployment is renamed
        ("NVIDIA-H100-80GB-HBM3", "llama-h100-80gb-hbm3"),
        ("NVIDIA-H200", "llama-h200"),
        ("NVIDIA-A100-SXM4-80GB", "llama-a100-sxm4-80gb"),
        ("NVIDIA-L40S", "llama-l40s"),
        ("Tesla-T4", "llama-tesla-t4"),
    ],
)
def test_canonical_labels_keep_their_names(product: str, name: str) -> None:
    assert pool_deployment_name("llama", product) == name
    assert canary_pod_name("llama", product, 3) == f"{name}-canary-k3"


def test_spellings_of_one_card_get_different_pools() -> None:
    spellings = ["NVIDIA_H200", "H200", "NVIDIA-H200", "nvidia-h200", "NVIDIA H200", "h200"]
    names = {pool_deployment_name("llama", p) for p in spellings}
    assert len(names) == len(spellings)
    assert pool_deployment_name("llama", "NVIDIA-H200") == "llama-h200"
    for p in spellings:
        if p != "NVIDIA-H200":  # changed by normalisation: marked with a hash
            assert HASH_TAIL.search(pool_deployment_name("llama", p)), p


def test_a_label_cannot_pose_as_another_ones_hash() -> None:
    """A canonical-looking label whose last part reads like a hash is hashed itself."""
    other = "H200"
    forged = "NVIDIA-" + product_slug(other).upper()  # `NVIDIA-H200-<HASH>`
    assert product_slug(forged) != product_slug(other)


def _odd_labels() -> list[str]:
    bases = ["H200", "H100-80GB-HBM3", "A100-SXM4-40GB-MIG-1g.5gb", "L40S", "T4", "", "X"]
    prefixes = ["", "NVIDIA-", "nvidia-", "Nvidia_", "NVIDIA_", "NVIDIA ", "Tesla-", "-", "_",
                "NVIDIA-NVIDIA-", " "]
    suffixes = ["", "-", "_", " ", "-SHARED", ".", "--X"]
    out = set()
    for base, prefix, suffix in itertools.product(bases, prefixes, suffixes):
        raw = prefix + base + suffix
        for variant in (raw, raw.lower(), raw.upper(), raw.replace("-", "_"),
                        raw.replace("-", " "), raw.replace("-", "--")):
            out.add(variant)
    out.add("NVIDIA-" + "H" * 80)  # longer than any name: cut and hashed
    out.add("NVIDIA-" + "H" * 80 + "X")
    return sorted(out)


@pytest.mark.parametrize("resource", ["llama", "a" * 50, "x" * 63])
def test_names_are_injective_and_valid(resource: str) -> None:
    labels = _odd_labels()
    assert len(labels) > 1000
    for build in (
        lambda p: pool_deployment_name(resource, p),
        lambda p: canary_pod_name(resource, p, 16),
    ):
        names = [build(p) for p in labels]
        assert len(set(names)) == len(labels)  # distinct labels, distinct names
        for name in names:
            assert len(name) <= 63 and DNS_1123_LABEL.match(name), name
