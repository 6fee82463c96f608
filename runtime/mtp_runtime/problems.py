"""Why a spec or a pool's settings cannot be served: one type, one way to print it. Pure.

Every check (the operator's spec checks, K planning, vLLM's own rules in `vllm_command`)
reports (field, message) pairs, so status conditions, Events, `mtp-operator render` and the
runtime's errors all name the field and say why, the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple


class Problem(NamedTuple):
    field: str  # the spec field, dotted camelCase (`speculative.numSpeculativeTokens`)
    message: str


def problems_text(found: Iterable[tuple[str, str]], field: Callable[[str], str] = str) -> str:
    """`field: message; field: message` (`field` may rename the fields, e.g. add `spec.`)."""
    return "; ".join(f"{field(f)}: {m}" for f, m in found)
