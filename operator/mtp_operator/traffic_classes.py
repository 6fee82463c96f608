"""Traffic classes (`spec.speculative.classes`): each class as the spec its pools are planned
from, and the checks of the class list. Pure.

A class pool is planned exactly as a pool of a resource whose K and tuning are the class's:
`class_spec` gives that spec, so the profile table, maxSpeculativeTokens, mtpLayers, rollback
and tuning apply per (GPU product, class) unchanged.
"""

from __future__ import annotations

from mtp_operator.api.classes import TrafficClass, class_list_problems
from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.planning import validate_spec
from mtp_operator.tuning.settings import tuning_problems
from mtp_runtime.problems import Problem

CLASSES_FIELD = "speculative.classes"


def classes_of(spec: MTPInferenceSpec) -> tuple[TrafficClass, ...]:
    """The spec's classes; empty: one pool per GPU product, as without classes."""
    return tuple(spec.speculative.classes or ())


def class_spec(spec: MTPInferenceSpec, cls: TrafficClass) -> MTPInferenceSpec:
    """The spec a pool of `cls` is planned from: the class's K, its tuning (else the
    resource's) and no classes."""
    s = spec.speculative
    speculative = s.model_copy(
        update={
            "num_speculative_tokens": cls.num_speculative_tokens,
            "tuning": cls.tuning if cls.tuning is not None else s.tuning,
            "classes": None,
        }
    )
    return spec.model_copy(update={"speculative": speculative})


def class_specs(spec: MTPInferenceSpec) -> dict[str, MTPInferenceSpec]:
    """Each class's spec by class name (none without classes)."""
    return {c.name: class_spec(spec, c) for c in classes_of(spec)}


def _moved(problem: Problem, at: str, own_tuning: bool) -> Problem | None:
    """A problem of a class's spec, named by the class's field; None when it is the
    resource's own field (reported there already)."""
    field = problem.field
    if field == "speculative.numSpeculativeTokens":
        return Problem(f"{at}.numSpeculativeTokens", problem.message)
    if field.startswith("speculative.tuning") and own_tuning:
        return Problem(at + field.removeprefix("speculative"), problem.message)
    return None


def class_problems(spec: MTPInferenceSpec) -> list[Problem]:
    """The class list's problems (ranges, duplicates, defaults, headers), then each class's
    K and tuning checked as the resource's are, named by the class's field."""
    classes = classes_of(spec)
    if not classes:
        return []
    found = class_list_problems(classes, CLASSES_FIELD)
    for i, cls in enumerate(classes):
        at = f"{CLASSES_FIELD}[{i}]"
        cspec = class_spec(spec, cls)
        for p in validate_spec(cspec) + [Problem(*t) for t in tuning_problems(cspec)]:
            moved = _moved(Problem(*p), at, cls.tuning is not None)
            if moved is not None and moved not in found:
                found.append(moved)
    return found
