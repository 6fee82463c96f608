"""Prometheus recording and alerting rules for MTP health, rendered from one function.

charts/mtp-operator/files/prometheus-rules.yaml is `render_rules()` with its defaults (a test
checks they do not drift); tests render short windows. The figures are exactly those of
shared/mtp-metrics.md (and runtime/mtp_runtime/figures.py), per pool: the labels
`namespace`, `mtpinference`, `gpu_product` and `traffic_class` (absent on a pool without traffic
classes) that Prometheus relabels from the pods' labels, so two class pools of one GPU product
are two pools here too, never one sum.

How c_{K-1} is selected: PromQL cannot turn the pool's K (a value, T/D) into a `position`
label, so the rules enumerate K = 1..max_k and keep, for each pool, the per-position increase
at position K-1 only where T/D equals K (within 1e-3). A window that mixes drafts of different
K (a change of K inside the window) has no whole K and gives no error-propagation sample, as
mtp_runtime.figures gives None; so do pools with K > max_k. D·(K-1) is written as T - D.

No data: every ratio divides by `(x > 0)`, which drops the pool when the denominator is 0, so
an idle pool has no sample (never 0, never NaN) and the alerts, which also need `min_drafts`
drafts in the window, cannot fire on it.
"""

from __future__ import annotations

from typing import Any

import yaml

from mtp_runtime.spec_decode import ACCEPTED, ACCEPTED_PER_POS, DRAFT_TOKENS, DRAFTS

from ..api.v1alpha1 import DEFAULT_MAX_ERROR_PROPAGATION_RATE, DEFAULT_MIN_HIT_RATE
from .signals import CLASS_LABEL, ERROR_PROPAGATION_HIGH, HIT_RATE_LOW, POOL_LABELS

# Recorded series (window-independent names, so dashboards and tests do not change with it).
R_DRAFTS = "mtp:spec_decode_drafts:increase"
R_DRAFT_TOKENS = "mtp:spec_decode_draft_tokens:increase"
R_ACCEPTED = "mtp:spec_decode_accepted_tokens:increase"
R_PER_POS = "mtp:spec_decode_accepted_tokens_per_pos:increase"
R_LAST_POS = "mtp:spec_decode_accepted_tokens_last_pos:increase"
R_K = "mtp:num_speculative_tokens:ratio"
R_HIT_RATE = "mtp:hit_rate:ratio"
R_ACCEPTANCE_RATE = "mtp:acceptance_rate:ratio"
R_MEAN_ACCEPTANCE_LENGTH = "mtp:mean_acceptance_length:ratio"
R_AVG_K_USED = "mtp:avg_k_used:ratio"
R_ERROR_PROPAGATION = "mtp:error_propagation_rate:ratio"

DEFAULT_WINDOW = "5m"
DEFAULT_FOR = "5m"
DEFAULT_MIN_DRAFTS = 50  # RollbackSpec.min_drafts' default: fewer drafts is too noisy to act on
DEFAULT_MAX_K = 16
K_TOLERANCE = 1e-3

_BY = ", ".join(POOL_LABELS)
_POOL_SELECTOR = '{mtpinference!=""}'  # vLLM servers not run by the operator are left out


def _increase(metric: str, window: str, extra_by: str = "") -> str:
    by = f"{_BY}, {extra_by}" if extra_by else _BY
    return f"sum by ({by}) (increase({metric}{_POOL_SELECTOR}[{window}]))"


def _last_position_expr(max_k: int) -> str:
    clauses = [
        f'max without (position) ({R_PER_POS}{{position="{k - 1}"}})\n'
        f"  and on ({_BY}) (abs({R_K} - {k}) < {K_TOLERANCE})"
        for k in range(1, max_k + 1)
    ]
    return "\n or\n".join(f"(\n  {c}\n)" for c in clauses) + "\n"


def _fmt(x: float) -> str:
    return repr(float(x)).removesuffix(".0") if float(x).is_integer() else repr(float(x))


def rule_groups(
    window: str = DEFAULT_WINDOW,
    for_: str = DEFAULT_FOR,
    min_hit_rate: float = DEFAULT_MIN_HIT_RATE,
    max_error_propagation: float = DEFAULT_MAX_ERROR_PROPAGATION_RATE,
    min_drafts: int = DEFAULT_MIN_DRAFTS,
    max_k: int = DEFAULT_MAX_K,
    severity: str = "warning",
) -> dict[str, Any]:
    """The rules as a Prometheus rule-file document (`{"groups": [...]}`)."""
    if max_k < 1:
        raise ValueError("max_k must be at least 1")
    drafts_ok = f"{R_DRAFTS} > 0"
    recording = [
        (R_DRAFTS, _increase(DRAFTS, window)),
        (R_DRAFT_TOKENS, _increase(DRAFT_TOKENS, window)),
        (R_ACCEPTED, _increase(ACCEPTED, window)),
        (R_PER_POS, _increase(ACCEPTED_PER_POS, window, "position")),
        # K as the counters show it (T/D); whole only when the window saw one K
        (R_K, f"{R_DRAFT_TOKENS} / ({drafts_ok})"),
        (R_LAST_POS, _last_position_expr(max_k)),
        (R_HIT_RATE, f'max without (position) ({R_PER_POS}{{position="0"}}) / ({drafts_ok})'),
        (R_ACCEPTANCE_RATE, f"{R_ACCEPTED} / ({R_DRAFT_TOKENS} > 0)"),
        (R_MEAN_ACCEPTANCE_LENGTH, f"1 + {R_ACCEPTED} / ({drafts_ok})"),
        (R_AVG_K_USED, f"{R_ACCEPTED} / ({drafts_ok})"),
        (
            R_ERROR_PROPAGATION,
            # (D·(K-1) - A + c_{K-1}) / T with D·(K-1) = T - D; clamp_min hides float dust
            f"clamp_min(\n  ({R_DRAFT_TOKENS} - {R_DRAFTS} - {R_ACCEPTED} + {R_LAST_POS})\n"
            f"  / ({R_DRAFT_TOKENS} > 0),\n  0\n)\n",
        ),
    ]
    enough = f"and on ({_BY}) {R_DRAFTS} >= {min_drafts}"
    pool = (
        "{{ $labels.namespace }}/{{ $labels.mtpinference }} pool {{ $labels.gpu_product }}"
        f"{{{{ with $labels.{CLASS_LABEL} }}}}/{{{{ . }}}}{{{{ end }}}}"
    )
    alerts = [
        {
            "alert": HIT_RATE_LOW,
            "expr": f"{R_HIT_RATE} < {_fmt(min_hit_rate)}\n{enough}\n",
            "for": for_,
            "labels": {"severity": severity},
            "annotations": {
                "summary": f"MTP hit rate low on {pool}",
                "description": (
                    "Only {{ $value | humanizePercentage }} of speculation steps had their "
                    f"first draft token accepted over {window} (threshold "
                    f"{_fmt(min_hit_rate)}): MTP is costing more than it gains; the operator "
                    "steps this pool's K down."
                ),
                "value": "{{ $value }}",
                "threshold": _fmt(min_hit_rate),
            },
        },
        {
            "alert": ERROR_PROPAGATION_HIGH,
            "expr": f"{R_ERROR_PROPAGATION} > {_fmt(max_error_propagation)}\n{enough}\n",
            "for": for_,
            "labels": {"severity": severity},
            "annotations": {
                "summary": f"MTP drafts mostly wasted behind earlier rejections on {pool}",
                "description": (
                    "{{ $value | humanizePercentage }} of draft tokens were thrown away "
                    f"because an earlier token of the same draft was rejected, over {window} "
                    f"(threshold {_fmt(max_error_propagation)}): the draft chain is too deep; "
                    "the operator steps this pool's K down."
                ),
                "value": "{{ $value }}",
                "threshold": _fmt(max_error_propagation),
            },
        },
    ]
    return {
        "groups": [
            {
                # one group: rules run in order, so each sees the series recorded above it
                "name": "mtp-operator",
                "rules": [{"record": name, "expr": expr} for name, expr in recording] + alerts,
            }
        ]
    }


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_presenter)

HEADER = """\
# Generated by mtp_operator.rollback.rules.render_rules(); do not edit by hand.
# Regenerate: python -m mtp_operator.rollback.rules > <this file>
# MTP health per pool (labels namespace, mtpinference, gpu_product, traffic_class), as in
# shared/mtp-metrics.md; window {window}, alerts after {for_}, at least {min_drafts} drafts.
"""


def render_rules(
    window: str = DEFAULT_WINDOW,
    for_: str = DEFAULT_FOR,
    min_hit_rate: float = DEFAULT_MIN_HIT_RATE,
    max_error_propagation: float = DEFAULT_MAX_ERROR_PROPAGATION_RATE,
    min_drafts: int = DEFAULT_MIN_DRAFTS,
    max_k: int = DEFAULT_MAX_K,
    severity: str = "warning",
) -> str:
    """The rule file as text: what the chart ships (defaults) or a test variant."""
    doc = rule_groups(
        window, for_, min_hit_rate, max_error_propagation, min_drafts, max_k, severity
    )
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1 << 16, allow_unicode=True)
    return HEADER.format(window=window, for_=for_, min_drafts=min_drafts) + body


if __name__ == "__main__":
    print(render_rules(), end="")
