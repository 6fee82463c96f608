"""Checks of a spec beyond what the API server's schema and CEL rules can see. Pure.

Every problem is a (field, message) pair, so status conditions, Events and the `render`
command all name the field and say why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.planning import data_parallel_size, validate_spec
from mtp_operator.pod_parts import pod_part_problems
from mtp_operator.traffic_classes import class_problems
from mtp_operator.tuning.settings import tuning_problems
from mtp_runtime.problems import Problem, problems_text

__all__ = ["Problem", "problems_text", "spec_problems"]


_UNION_BRANCHES = frozenset({"int", "str", "float", "bool"})


def _field(loc: tuple[Any, ...]) -> str:
    # pydantic reports union branches as extra path parts ("int", "str", "literal['auto']");
    # user keys such as a nodeSelector key `strategy` are path parts too and must stay
    # list indexes are written as Kubernetes writes them: env[2].name
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        elif str(p) not in _UNION_BRANCHES and not str(p).startswith("literal["):
            out += f".{p}" if out else str(p)
    return out or "spec"


def _message(msg: str) -> str:
    # a model's own check (e.g. modelCache's "exactly one of") arrives as "Value error, ..."
    return msg.removeprefix("Value error, ")


def data_parallel_problems(spec: MTPInferenceSpec) -> list[Problem]:
    """A batch-size schedule where vLLM 0.33 would run data parallelism > 1: vLLM drops
    num_speculative_tokens_per_batch_size then (`VllmConfig.
    _maybe_disable_dynamic_sd_for_data_parallel`, config/vllm.py: data-parallel ranks could
    pick different K and deadlock) and runs the static numSpeculativeTokens. The flags are
    reserved in extraArgs; VLLM_DP_SIZE in env (ParallelConfig's fallback) is the way left."""
    if not spec.speculative.batch_size_schedule:
        return []
    size, i = data_parallel_size(spec)
    if size > 1:
        return [Problem(
            "speculative.batchSizeSchedule",
            f"vLLM 0.33 ignores it with data parallelism > 1 (env[{i}] VLLM_DP_SIZE="
            f"{size}) and runs the static numSpeculativeTokens; drop one of the two")]
    return []


def spec_problems(raw_spec: Mapping[str, Any]) -> tuple[MTPInferenceSpec | None, list[Problem]]:
    """Parse and check a spec: (spec, []) or (spec or None, [(field, message), ...])."""
    if not isinstance(raw_spec, Mapping):
        return None, [Problem("spec", f"must be an object, not {type(raw_spec).__name__}")]
    try:
        spec = MTPInferenceSpec.model_validate(dict(raw_spec))
    except ValidationError as err:
        problems = {Problem(_field(e["loc"]), _message(e["msg"])) for e in err.errors()}
        return None, sorted(problems)
    parts = pod_part_problems(spec.env, spec.resources, spec.tolerations)
    found = (validate_spec(spec) + tuning_problems(spec) + class_problems(spec)
             + data_parallel_problems(spec))
    return spec, parts + [p for p in found if p not in parts]
