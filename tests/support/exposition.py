"""A small, hand-written Prometheus text-exposition reader for tests: independent of
mtp_runtime's parser, so that tests check the runtime's figures instead of reusing its code."""

from __future__ import annotations

import re

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> tuple[dict[str, str], dict[str, str], list[tuple[str, dict, float]]]:
    """(TYPE by family, HELP by family, samples) of a Prometheus text exposition."""
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    samples: list[tuple[str, dict, float]] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line.startswith("# HELP "):
            parts = line.split(" ", 3)
            helps[parts[2]] = parts[3] if len(parts) > 3 else ""
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, f"unparsable exposition line: {line!r}"
            samples.append((m.group(1), dict(LABEL.findall(m.group(3) or "")),
                            float(m.group(4))))
    return types, helps, samples


def sample_sum(text: str, name: str) -> float:
    """The sum of one metric's samples over all its label sets (other lines are ignored)."""
    total = 0.0
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) == name:
            total += float(m.group(4))
    return total


def raw_counters(text: str) -> dict[str, object]:
    """D, T, A and c_j summed over series, read straight from the exposition."""
    _, _, samples = parse(text)
    out: dict[str, object] = {"D": 0.0, "T": 0.0, "A": 0.0, "c": {}}
    names = {"vllm:spec_decode_num_drafts_total": "D",
             "vllm:spec_decode_num_draft_tokens_total": "T",
             "vllm:spec_decode_num_accepted_tokens_total": "A"}
    for name, labels, value in samples:
        if name in names:
            out[names[name]] += value
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            j = int(labels["position"])
            out["c"][j] = out["c"].get(j, 0.0) + value
    return out
