"""The base of every API model: camelCase on the wire, unknown fields refused, immutable."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

INT32_MAX = 2**31 - 1  # Kubernetes' int32 fields (a Deployment's replicas)


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )
