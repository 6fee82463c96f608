"""The settings the operator hands to a pool's pods (env `MTP_RUNTIME_CONFIG`, one JSON object).

Pure and shared: the operator writes it, the runtime reads it. It carries the resolved
settings (what the operator reports) plus what the runtime needs to re-check them against
the GPU the pod really got.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from mtp_runtime.gpu_profiles import KRequest, KResolution, base_product, resolve_k
from mtp_runtime.model_cache import ModelCache
from mtp_runtime.vllm_command import ServeSettings

ENV_VAR = "MTP_RUNTIME_CONFIG"


@dataclass(frozen=True)
class PoolConfig:
    serve: ServeSettings
    gpu_product: str  # the pool's `nvidia.com/gpu.product`
    # "auto": K follows the GPU (re-resolved if the pod landed on another GPU);
    # "fixed": K was set explicitly, by the spec or by a rollback, and is kept as is.
    k_mode: Literal["auto", "fixed"] = "auto"
    profiles: dict[str, int] = field(default_factory=dict)
    cluster_overrides: dict[str, int] = field(default_factory=dict)
    max_speculative_tokens: int | None = None
    # the cache volume (None: no cache); left out of the JSON when None, so pools without a
    # cache keep the configuration, and the pod template, they had before caches existed
    model_cache: ModelCache | None = None

    def to_json(self) -> str:
        data = asdict(self)
        if not data["serve"]["batch_size_schedule"]:  # absent unless set (same hash as before)
            del data["serve"]["batch_size_schedule"]
        for name in ("pipeline_parallel_size", "nnodes"):  # likewise: one node, one stage
            if data["serve"].get(name) == 1:
                del data["serve"][name]
        if data["model_cache"] is None:
            del data["model_cache"]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> PoolConfig:
        data = json.loads(text)
        serve = data.pop("serve")
        serve["extra_args"] = tuple(serve.get("extra_args") or ())
        cache = data.pop("model_cache", None)
        return cls(
            serve=ServeSettings(**serve),
            model_cache=None if cache is None else ModelCache(**cache),
            **data,
        )

    def for_gpu(self, detected_product: str) -> tuple[ServeSettings, KResolution | None]:
        """The settings to run on `detected_product`.

        Same product, or K fixed → the settings as the operator resolved them. Another
        product with K "auto" → K re-resolved for the GPU the pod really has.
        """
        if self.k_mode == "fixed" or same_product(detected_product, self.gpu_product):
            return self.serve, None
        request = KRequest(
            num_speculative_tokens="auto",
            profiles=self.profiles or None,
            max_speculative_tokens=self.max_speculative_tokens,
            mtp_layers=self.serve.mtp_layers,
            model=self.serve.model,
            method=self.serve.method,
        )
        resolution = resolve_k(detected_product, request, self.cluster_overrides or None)
        return replace(self.serve, num_speculative_tokens=resolution.k), resolution


def same_product(a: str, b: str) -> bool:
    """Same card? A MIG slice or a time-shared GPU (as GFD labels it) is the card it lives on,
    which is what NVML reports inside the pod."""
    return base_product(a).lower() == base_product(b).lower()
