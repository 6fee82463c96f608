"""Which number of speculative tokens K suits which GPU, and how a pool's K is resolved.

Pure and shared: the operator imports this to plan pools and the runtime imports it to
double-check the GPU a pod really got, so both always agree. No I/O, no clock.

Products are matched on the strings NVIDIA GPU Feature Discovery puts in the node label
`nvidia.com/gpu.product` (the device name with spaces turned into dashes, e.g.
`NVIDIA-H100-80GB-HBM3`). MIG slices (`A100-SXM4-40GB-MIG-1g.5gb`) and time-sliced sharing
(`...-SHARED`) keep the family of the card they live on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

# K used for a GPU no table entry names (the field report's "others → 3").
DEFAULT_K = 3

# Pool `source` values, as reported in MTPInference status.pools[].source.
# Why a pool has its K (status.pools[].source, the CRD enum; the operator re-exports it).
PoolSource = Literal["profile", "override", "cap", "rollback", "off", "tuned"]


# vLLM's num_speculative_tokens_per_batch_size: inclusive (first batch size, last, K) bands
Schedule = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class GPUProfile:
    family: str  # the model token in the product string, e.g. "H100"
    k: int  # the largest K the pool runs (with a schedule: its largest band K)
    reason: str
    # K per batch-size band where a measurement found the best K differs across bands; empty:
    # one K at every batch size. vLLM sizes per-request draft state for the largest K.
    schedule: Schedule = ()


# The default table. A100, H100 and L40S come from the field report; the other rows are our
# choices, each with its reason, until a measurement replaces them. K only pays off while the
# GPU has spare compute for verifying the draft in the same memory-bound decode step, so cards
# with much compute per byte of bandwidth take larger K, and small inference cards smaller K.
DEFAULT_PROFILES: tuple[GPUProfile, ...] = (
    GPUProfile("H100", 6, "field report"),
    GPUProfile("A100", 4, "field report"),
    GPUProfile("L40S", 2, "field report"),
    GPUProfile("H200", 6, "H100 silicon with more HBM bandwidth: at least H100's headroom"),
    GPUProfile("GH200", 6, "H100-class GPU (Grace Hopper): same as H100"),
    GPUProfile("H800", 6, "H100 with reduced NVLink only: decode per GPU as H100"),
    GPUProfile("H20", 4, "Hopper with a fraction of H100's compute: verification costs more"),
    GPUProfile("B200", 6, "more compute per byte than H100; kept at H100's K until measured"),
    GPUProfile("GB200", 6, "B200 in a Grace Blackwell board: as B200"),
    GPUProfile("B100", 6, "Blackwell, as B200"),
    GPUProfile("A800", 4, "A100 with reduced NVLink only: as A100"),
    GPUProfile("L40", 2, "same Ada die as L40S, less compute: as L40S"),
    GPUProfile("L4", 2, "small Ada inference card, little spare compute: as L40S"),
    GPUProfile("A10G", 2, "Ampere inference card with a third of A100's bandwidth: small K"),
    GPUProfile("A10", 2, "as A10G"),
    GPUProfile("T4", 1, "Turing inference card with little compute: one token at most"),
)

# Hybrid models (gated-DeltaNet layers beside attention: Qwen3.5, Qwen3.6, Qwen3-Next) keep
# 1 + K copies of each request's recurrent state, so K costs them KV capacity as well as draft
# time, and their best K is lower than a dense model's. Known by the MTP method the seed writes
# for them (`qwen3_next_mtp`) or by the model's name.
HYBRID_METHODS = frozenset({"qwen3_next_mtp"})
_HYBRID_MODEL = re.compile(r"qwen3[._-]?(?:5|6|next)(?![0-9])", re.IGNORECASE)


def is_hybrid(model: str | None, method: str | None) -> bool:
    """A model whose per-request draft state grows with K (see HYBRID_METHODS)."""
    return (method or "") in HYBRID_METHODS or bool(_HYBRID_MODEL.search(model or ""))


# Measured at real size (bench/results/gpu/realsize.md, `bench/gpu/realsize_summary.py`
# `choose`): the default K for a pool whose concurrency is not known — the K whose worst
# batch band (1-2, 3-8, 9-32, 33+ requests) keeps the largest share of that band's best K at
# per-position acceptance 0.8, capacity included. tests/unit/bench/test_measured_profiles.py
# recomputes each row from the committed results.
MEASURED_HYBRID_PROFILES: tuple[GPUProfile, ...] = (
    GPUProfile("H100", 2, "measured: H100 80GB HBM3, 27B-class hybrid (Qwen3.5 shape), vLLM "
               "0.26.0; its worst batch band keeps 81 % of that band's best K (K=5 up to 32 "
               "requests, K=2 at 64; K=6 keeps 48 % at 64): bench/results/gpu/realsize.md"),
)

# The cards the field report measured (the table's first three rows), as GPU Feature
# Discovery names them: what `mtp-operator render` plans pools for when it is told no product.
FIELD_REPORT_PRODUCTS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S")

_SUFFIXES = re.compile(r"(-MIG-.*|-SHARED)$", re.IGNORECASE)


def normalize_product(name: str) -> str:
    """A device name as NVML or nvidia-smi reports it → the GPU Feature Discovery label value.

    `NVIDIA H200` → `NVIDIA-H200`; already-normalised strings are returned unchanged.
    """
    return "-".join(name.strip().split())


def base_product(product: str) -> str:
    """The card a product string names, without MIG-slice or sharing suffixes.

    `NVIDIA-A100-SXM4-40GB-MIG-1g.5gb` → `NVIDIA-A100-SXM4-40GB`; `NVIDIA-H200-SHARED` →
    `NVIDIA-H200`. NVML and nvidia-smi report the card, GFD may report the slice.
    """
    return _SUFFIXES.sub("", normalize_product(product))


_MIG_SLICE = re.compile(r"-MIG-(\d+)g\.", re.IGNORECASE)
_MIG_SLICES_PER_CARD = {"A30": 4}  # compute slices of a whole card; 7 for A100/H100/H200/...


def share_of_card(product: str) -> tuple[float, str] | None:
    """(share of the card's compute, how) for a MIG slice or a time-shared product, else None.

    `...-MIG-1g.5gb` on a 7-slice card → (1/7, "a 1g MIG slice"); `...-SHARED` (time-slicing:
    several pods on one GPU, how many is not in the name) → (1/2, "a time-shared GPU").
    """
    m = _MIG_SLICE.search(product)
    if m:
        slices = _MIG_SLICES_PER_CARD.get(product_family(product) or "", 7)
        n = min(int(m.group(1)), slices)
        return n / slices, f"a {n}g MIG slice ({n}/{slices} of the card's compute)"
    if product.upper().endswith("-SHARED"):
        return 0.5, "a time-shared GPU (at most half the card's compute)"
    return None


def product_kind_label(product: str) -> str:
    """A short name that tells slices and shared GPUs from whole cards (`kubectl get mtpi`):
    `A100`, `A100-MIG-1g.5gb`, `H200-SHARED`."""
    family = product_family(product)
    if family is None:
        return ""
    suffix = _SUFFIXES.search(normalize_product(product))
    return family + (suffix.group(1) if suffix else "")


@lru_cache(maxsize=1024)  # a cluster has a handful of products; every pass asks per pool
def product_family(product: str) -> str | None:
    """The family token of a GFD product string (`NVIDIA-H100-80GB-HBM3` → `H100`), if known."""
    base = base_product(product)
    tokens = [t.upper() for t in base.split("-")]
    known = {p.family for p in DEFAULT_PROFILES}
    for token in tokens:
        if token in known:
            return token
    return None


def _lookup(table: Mapping[str, int], product: str) -> int | None:
    """An override table may name an exact product string or a family (`H100`)."""
    normalized = normalize_product(product)
    for key, k in table.items():
        if normalize_product(key).lower() == normalized.lower():
            return k
    family = product_family(product)
    if family is not None:
        for key, k in table.items():
            if key.upper() == family:
                return k
    return None


def entries_for(table: Mapping[str, int] | None, product: str) -> dict[str, int]:
    """The entries of an override table that apply to `product` (its exact name or family).

    A pool's pods carry only these, so editing another GPU's entry never rolls this pool.
    """
    family = product_family(product)
    wanted = normalize_product(product).lower()
    return {
        key: k
        for key, k in (table or {}).items()
        if normalize_product(key).lower() == wanted or (family and key.upper() == family)
    }


def default_k(product: str, cluster_overrides: Mapping[str, int] | None = None,
              hybrid: bool = False) -> int:
    """The cluster's K for a GPU product: the cluster-wide overrides, then the default table
    (its measured hybrid-model rows for a hybrid model)."""
    if cluster_overrides:
        k = _lookup(cluster_overrides, product)
        if k is not None:
            return k
    profile = profile_for(product, hybrid)
    return profile.k if profile is not None else DEFAULT_K


def valid_k_for_depth(k: int, mtp_layers: int | None) -> bool:
    """vLLM runs K > n_predict only when K is a multiple of the model's MTP depth."""
    return not mtp_layers or k <= mtp_layers or k % mtp_layers == 0


@dataclass(frozen=True)
class KRequest:
    """What a resource asks for; `num_speculative_tokens` is "auto" or an explicit K ≥ 0."""

    num_speculative_tokens: int | Literal["auto"] = "auto"
    profiles: Mapping[str, int] | None = None  # the resource's own per-product overrides
    max_speculative_tokens: int | None = None
    mtp_layers: int | None = None
    model: str | None = None  # with method: picks a measured hybrid-model row
    method: str | None = None


@dataclass(frozen=True)
class KResolution:
    k: int
    source: PoolSource
    reason: str
    schedule: Schedule = ()  # from a measured profile: K per batch-size band, each <= k


def profile_for(product: str, hybrid: bool = False) -> GPUProfile | None:
    """The table row for a product: a measured hybrid-model row first when `hybrid`."""
    family = product_family(product)
    rows = (*MEASURED_HYBRID_PROFILES, *DEFAULT_PROFILES) if hybrid else DEFAULT_PROFILES
    for profile in rows:
        if profile.family == family:
            return profile
    return None


def bounded_schedule(schedule: Schedule, k_max: int, depth: int | None) -> Schedule:
    """`schedule` with every band's K at most `k_max` and valid for the MTP depth, neighbours
    of equal K merged; empty when one K is left for every batch size (then K says it all)."""
    out: list[tuple[int, int, int]] = []
    for first, last, k in schedule:
        k = min(k, k_max)
        if not valid_k_for_depth(k, depth):
            k = (k // depth) * depth if depth else k
        if out and out[-1][2] == k and out[-1][1] + 1 == first:
            out[-1] = (out[-1][0], last, k)
        else:
            out.append((first, last, k))
    return tuple(out) if len({k for _, _, k in out}) > 1 else ()


class KError(ValueError):
    """A K the user asked for that vLLM would refuse; `field` names the spec field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _depth_message(k: int, depth: int) -> str:
    multiples = ", ".join(str(depth * i) for i in range(1, 4))
    return (
        f"{k} is not valid for a model with mtpLayers={depth}: above the model's MTP depth "
        f"K must be a multiple of it ({multiples}, ...), or at most {depth}"
    )


def resolve_k(
    product: str,
    request: KRequest,
    cluster_overrides: Mapping[str, int] | None = None,
) -> KResolution:
    """Resolve the K a pool on `product` runs with, and say where it came from.

    Order: an explicit K, else the resource's profiles, else the cluster's table. A K the
    user wrote that vLLM would reject raises KError; a K from a table is lowered to the
    nearest valid value instead (source "cap"), and so is anything above the cap.
    """
    depth = request.mtp_layers
    cap = request.max_speculative_tokens
    explicit = request.num_speculative_tokens
    schedule: Schedule = ()
    if explicit != "auto":
        field = "speculative.numSpeculativeTokens"
        if cap is not None and explicit > cap:
            raise KError(field, f"{explicit} exceeds speculative.maxSpeculativeTokens={cap}")
        if not valid_k_for_depth(explicit, depth):
            raise KError(field, _depth_message(explicit, depth))
        if explicit == 0:
            return KResolution(0, "off", "speculation turned off in the spec")
        return KResolution(explicit, "override", "numSpeculativeTokens set in the spec")

    own = _lookup(request.profiles, product) if request.profiles else None
    if own is not None:
        if not valid_k_for_depth(own, depth):
            raise KError(f"speculative.profiles[{product}]", _depth_message(own, depth))
        k, source, reason = own, "override", "speculative.profiles entry"
    else:
        profile = profile_for(product, is_hybrid(request.model, request.method))
        override = _lookup(cluster_overrides, product) if cluster_overrides else None
        source = "profile"
        reason = f"GPU profile for {product_family(product) or 'other GPUs'}"
        if override is not None:
            k = override
        else:
            k = profile.k if profile is not None else DEFAULT_K
            if profile is not None and profile in MEASURED_HYBRID_PROFILES:
                reason = f"{reason}, hybrid model ({profile.reason})"
            elif profile is not None and profile.schedule:
                reason = f"{reason} ({profile.reason})"
            schedule = profile.schedule if profile is not None else ()
        share = share_of_card(product)
        exact = cluster_overrides and any(
            normalize_product(key).lower() == normalize_product(product).lower()
            for key in cluster_overrides
        )
        if share is not None and not exact and k > 0:
            # the table's K is for a whole card: verification needs spare compute, and a slice
            # or a shared GPU has only its share of it
            k = max(1, int(k * share[0]))
            reason = f"{reason}, scaled to {share[1]}"
            schedule = ()  # measured on whole cards

    if cap is not None and k > cap:
        k, source, reason = cap, "cap", f"{reason}, capped by maxSpeculativeTokens={cap}"
    if not valid_k_for_depth(k, depth):
        lowered = (k // depth) * depth
        k, source = lowered, "cap"
        reason = f"{reason}, lowered to a multiple of mtpLayers={depth}"
    if k == 0:
        return KResolution(0, "off", f"{reason}: speculation off")
    return KResolution(k, source, reason, bounded_schedule(schedule, k, depth))
