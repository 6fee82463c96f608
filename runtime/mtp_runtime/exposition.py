"""Prometheus text exposition (format 0.0.4, and the OpenMetrics subset vLLM could emit),
parsed into samples. Pure: callers pass the text in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass
class Exposition:
    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)  # family name → counter/gauge/...
    helps: dict[str, str] = field(default_factory=dict)

    def family(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]


class ParseError(ValueError):
    pass


def _parse_labels(text: str, i: int, lineno: int) -> tuple[dict[str, str], int]:
    """Parse `{a="x",b="y"}` starting at text[i] == '{'; returns labels and the index after '}'."""
    labels: dict[str, str] = {}
    i += 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t,":
            i += 1
        if i >= n:
            raise ParseError(f"line {lineno}: unterminated label set")
        if text[i] == "}":
            return labels, i + 1
        eq = text.find("=", i)
        if eq < 0:
            raise ParseError(f"line {lineno}: label without '='")
        key = text[i:eq].strip()
        i = eq + 1
        while i < n and text[i] in " \t":
            i += 1
        if i >= n or text[i] != '"':
            raise ParseError(f"line {lineno}: label value must be quoted")
        i += 1
        out: list[str] = []
        while True:
            if i >= n:
                raise ParseError(f"line {lineno}: unterminated label value")
            ch = text[i]
            if ch == "\\" and i + 1 < n:
                nxt = text[i + 1]
                out.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
                i += 2
                continue
            if ch == '"':
                i += 1
                break
            out.append(ch)
            i += 1
        labels[key] = "".join(out)


def _parse_value(token: str, lineno: int) -> float:
    special = {"+inf": math.inf, "inf": math.inf, "-inf": -math.inf, "nan": math.nan}
    try:
        return special[token.lower()] if token.lower() in special else float(token)
    except ValueError as exc:
        raise ParseError(f"line {lineno}: bad sample value {token!r}") from exc


def parse_exposition(text: str) -> Exposition:
    """Parse a Prometheus text exposition into samples plus the HELP/TYPE of each family."""
    exp = Exposition()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP"):
                rest = parts[3] if len(parts) > 3 else ""
                if parts[1] == "TYPE":
                    exp.types[parts[2]] = rest.strip()
                else:
                    exp.helps[parts[2]] = rest
            continue
        brace = line.find("{")
        space = min((p for p in (line.find(" "), line.find("\t")) if p >= 0), default=-1)
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            labels, end = _parse_labels(line, brace, lineno)
            rest = line[end:].split()
        else:
            if space < 0:
                raise ParseError(f"line {lineno}: sample without value")
            name = line[:space]
            labels = {}
            rest = line[space:].split()
        if not rest:
            raise ParseError(f"line {lineno}: sample without value")
        exp.samples.append(Sample(name.strip(), labels, _parse_value(rest[0], lineno)))
    return exp
