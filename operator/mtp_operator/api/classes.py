"""MTPInference v1alpha1, traffic classes: `spec.speculative.classes`.

A class is a slice of the traffic with a K of its own: requests whose prompt length in tokens
falls in a range (`promptTokens`), or that carry a header value (`header`), or, for at most
one class, every request no other class matches (the default). Each class gets its own pool
per GPU product, and the endpoint picker routes each request to the pool of its class
(`mtp_operator.routing`). Field names are the public contract; the checks a list needs
(ranges, duplicates, one default) are `class_list_problems` here and the CEL in
`CLASSES_CEL`, so the operator and the API server refuse the same specs, naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator

from mtp_operator.api.base import Model as _Model
from mtp_operator.api.tuning import TuningSpec
from mtp_runtime.problems import Problem
from mtp_runtime.vllm_command import MAX_SPECULATIVE_TOKENS

# Every class is one more pool per GPU product; 8 classes on 4 products is 32 pools already.
MAX_CLASSES = 8
# Class names go into pool names, labels and Service names: lower-case letters and digits, no
# `-`, so the class is always the last part of a pool's name (naming.class_pool_name).
MAX_CLASS_NAME = 15
CLASS_NAME_PATTERN = r"^[a-z][a-z0-9]*$"
# The longest prompt a range may name: Kubernetes' int32, far above any context length.
MAX_PROMPT_TOKENS = 2**31 - 1
# RFC 9110 section 5.6.2: a field name is a token, 1*tchar.
HEADER_NAME_PATTERN = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"
MAX_HEADER_NAME = 256
# RFC 9110 section 5.5: a field value without leading or trailing whitespace; visible ASCII
# and inner spaces only (no obs-text: the value is also a label value's source, see routing).
HEADER_VALUE_PATTERN = r"^[!-~]([ -~]*[!-~])?$"
MAX_HEADER_VALUE = 256


class PromptTokens(_Model):
    """A prompt-length range in tokens, both ends included: `{min: 128, max: 512}`; without
    `max` it has no upper end."""

    min: int = Field(0, ge=0, le=MAX_PROMPT_TOKENS, description="Fewest prompt tokens (included).")
    max: int | None = Field(
        None,
        ge=0,
        le=MAX_PROMPT_TOKENS,
        description="Most prompt tokens (included); omitted: no upper end.",
    )

    @property
    def upper(self) -> int:
        return MAX_PROMPT_TOKENS if self.max is None else self.max


class HeaderMatch(_Model):
    """A request header value that selects the class, e.g. `x-mtp-class: code`. Header names
    compare case-insensitively (HTTP), values exactly."""

    name: str = Field(
        ...,
        min_length=1,
        max_length=MAX_HEADER_NAME,
        json_schema_extra={"pattern": HEADER_NAME_PATTERN},  # checked below, with a message
        description="The header's name: an HTTP token (RFC 9110: letters, digits and "
        "!#$%&'*+-.^_`|~).",
    )

    @field_validator("name")
    @classmethod
    def _token(cls, value: str) -> str:
        if not re.fullmatch(HEADER_NAME_PATTERN, value):
            bad = sorted({ch for ch in value if not re.fullmatch(HEADER_NAME_PATTERN, ch)})
            raise ValueError(
                f"{value!r} is not an HTTP header name (RFC 9110 token): {bad!r} not allowed; "
                "use letters, digits and !#$%&'*+-.^_`|~"
            )
        return value
    value: str = Field(
        ...,
        min_length=1,
        max_length=MAX_HEADER_VALUE,
        pattern=HEADER_VALUE_PATTERN,
        description="The value that selects the class (visible ASCII, inner spaces allowed).",
    )


class TrafficClass(_Model):
    """One class: its match (promptTokens or header; neither: the default class) and its K."""

    name: str = Field(
        ...,
        min_length=1,
        max_length=MAX_CLASS_NAME,
        pattern=CLASS_NAME_PATTERN,
        description="The class's name (lower-case letters and digits, starting with a letter): "
        "part of its pools' names, labels and Service.",
    )
    prompt_tokens: PromptTokens | None = Field(
        None, description="Requests whose prompt has this many tokens."
    )
    header: HeaderMatch | None = Field(None, description="Requests that carry this header value.")
    num_speculative_tokens: int | Literal["auto"] = Field(
        "auto",
        description="This class's K: `auto` (per GPU product, from the profile table) or an "
        f"integer 0-{MAX_SPECULATIVE_TOKENS}; maxSpeculativeTokens and mtpLayers apply.",
    )
    tuning: TuningSpec | None = Field(
        None,
        description="Measured K for this class's pools; omitted: speculative.tuning. Each "
        "class pool tunes on its own traffic.",
    )

    @property
    def is_default(self) -> bool:
        return self.prompt_tokens is None and self.header is None


def context_length_range(cls: TrafficClass) -> str | None:
    """A length class's `llm-d.ai/context-length-range` label value, "min-max" in tokens
    (both included; an open range ends at MAX_PROMPT_TOKENS); None for other classes."""
    r = cls.prompt_tokens
    if r is None or cls.header is not None:
        return None
    return f"{r.min}-{r.upper}"


def class_list_problems(classes: Sequence[TrafficClass], field: str) -> list[Problem]:
    """What a list of classes must satisfy beyond each class's own schema (`field` is the
    list's path, e.g. `speculative.classes`), each problem naming the entry."""
    found: list[Problem] = []
    if len(classes) > MAX_CLASSES:
        found.append(Problem(field, f"{len(classes)} classes: at most {MAX_CLASSES}"))
    seen: dict[str, int] = {}
    headers: dict[tuple[str, str], int] = {}
    defaults: list[int] = []
    for i, c in enumerate(classes):
        at = f"{field}[{i}]"
        if c.name in seen:
            found.append(Problem(f"{at}.name", f"{c.name!r} is also {field}[{seen[c.name]}]"))
        seen.setdefault(c.name, i)
        if c.prompt_tokens is not None and c.header is not None:
            found.append(Problem(at, "set promptTokens or header, not both"))
        if c.is_default:
            defaults.append(i)
        if c.header is not None:
            key = (c.header.name.lower(), c.header.value)
            if key in headers:
                found.append(Problem(
                    f"{at}.header",
                    f"{c.header.name}: {c.header.value} is also {field}[{headers[key]}]'s",
                ))
            headers.setdefault(key, i)
    if len(defaults) > 1:
        found.append(Problem(
            f"{field}[{defaults[1]}]",
            f"a second default class (no promptTokens, no header): {field}[{defaults[0]}] is one",
        ))
    found += _range_problems(classes, field, bool(defaults))
    return found


def _range_problems(
    classes: Sequence[TrafficClass], field: str, has_default: bool
) -> list[Problem]:
    ranged = sorted(
        ((c.prompt_tokens.min, c.prompt_tokens.upper, i)
         for i, c in enumerate(classes) if c.prompt_tokens is not None and c.header is None),
    )
    found: list[Problem] = []
    for lo, hi, i in ranged:
        if lo > hi:
            found.append(Problem(
                f"{field}[{i}].promptTokens", f"min {lo} is above max {hi}"
            ))
    if found:
        return found
    reach, last_i = -1, -1  # the highest token any range so far covers, and whose
    for lo, hi, i in ranged:
        if last_i >= 0 and lo <= reach:
            found.append(Problem(
                f"{field}[{i}].promptTokens",
                f"{lo}-{min(hi, reach)} tokens overlap {field}[{last_i}].promptTokens",
            ))
        elif last_i >= 0 and lo > reach + 1:
            found.append(Problem(
                f"{field}[{i}].promptTokens",
                f"leaves a gap: {reach + 1}-{lo - 1} tokens match no class (ranges must "
                f"follow {field}[{last_i}].promptTokens without a gap)",
            ))
        if hi > reach:
            reach, last_i = hi, i
    if ranged and not has_default:
        lo, _, first = ranged[0]
        _, hi, last = ranged[-1]
        if lo > 0:
            found.append(Problem(
                f"{field}[{first}].promptTokens",
                f"prompts of 0-{lo - 1} tokens match no class: start at min 0 or add a "
                "default class",
            ))
        if hi < MAX_PROMPT_TOKENS:
            found.append(Problem(
                f"{field}[{last}].promptTokens",
                f"prompts above {hi} tokens match no class: omit max or add a default class",
            ))
    return found


# The same checks as CEL on the list (the API server's), each naming the entry it refuses.
# Names are unique by the schema (a list-map keyed by name); the bound is maxItems.
_LEN = "has({v}.promptTokens) && !has({v}.header)"
_MAX = f"(has({{v}}.promptTokens.max) ? {{v}}.promptTokens.max : {MAX_PROMPT_TOKENS})"


def _ranged(v: str) -> str:
    return _LEN.format(v=v)


def _upper(v: str) -> str:
    return _MAX.format(v=v)


_DEFAULT = "!has({v}.promptTokens) && !has({v}.header)"
CLASSES_CEL = [
    {
        "rule": "self.filter(c, " + _DEFAULT.format(v="c") + ").size() <= 1",
        "message": "at most one default class (no promptTokens, no header)",
    },
    {
        "rule": "self.all(a, self.all(b, a.name == b.name || !(" + _ranged("a") + ") || !("
        + _ranged("b") + ") || " + _upper("a") + " < b.promptTokens.min || "
        + _upper("b") + " < a.promptTokens.min))",
        "message": "promptTokens ranges must not overlap",
    },
    {
        # every range but the highest is followed, without a gap, by another
        "rule": "self.all(a, !(" + _ranged("a") + ") || self.exists(b, " + _ranged("b")
        + " && b.promptTokens.min == " + _upper("a") + " + 1) || !self.exists(b, "
        + _ranged("b") + " && b.promptTokens.min > " + _upper("a") + "))",
        "message": "promptTokens ranges must leave no gap between them",
    },
    {
        # without a default class, the ranges cover every length
        "rule": "!self.exists(c, " + _ranged("c") + ") || self.exists(c, "
        + _DEFAULT.format(v="c") + ") || (self.exists(c, " + _ranged("c")
        + " && c.promptTokens.min == 0) && self.exists(c, " + _ranged("c")
        + " && !has(c.promptTokens.max)))",
        "message": "promptTokens ranges must cover every prompt length (from min 0, the last "
        "without max) unless a default class takes the rest",
    },
    {
        "rule": "self.all(a, self.all(b, a.name == b.name || !has(a.header) || !has(b.header) "
        "|| a.header.name.lowerAscii() != b.header.name.lowerAscii() || "
        "a.header.value != b.header.value))",
        "message": "two classes match the same header value",
    },
]
CLASS_CEL = [
    {
        "rule": "!has(self.promptTokens) || !has(self.header)",
        "message": "set promptTokens or header, not both",
    },
]
PROMPT_TOKENS_CEL = [
    {
        "rule": "!has(self.max) || self.min <= self.max",
        "message": "min must not be above max",
        "fieldPath": ".min",
        "reason": "FieldValueInvalid",
    },
]
# On spec.speculative: a class's integer K within maxSpeculativeTokens.
SPECULATIVE_CEL = [
    {
        "rule": "!has(self.classes) || !has(self.maxSpeculativeTokens) || self.classes.all(c, "
        "type(c.numSpeculativeTokens) == string || "
        "c.numSpeculativeTokens <= self.maxSpeculativeTokens)",
        "message": "classes[].numSpeculativeTokens must not exceed maxSpeculativeTokens",
        "fieldPath": ".classes",
        "reason": "FieldValueInvalid",
    },
]
