"""The fake vLLM stays honest: same spec-decode families as vLLM 0.33.0's own exposition."""

from __future__ import annotations

import json
import urllib.request

import pytest

from mtp_runtime import exposition, figures, spec_decode

pytestmark = pytest.mark.unit

SPEC_PREFIX = "vllm:spec_decode_"


def _shape(text: str) -> tuple[dict[str, str], dict[str, str], set[tuple[str, tuple[str, ...]]]]:
    e = exposition.parse_exposition(text)
    types = {k: v for k, v in e.types.items() if k.startswith(SPEC_PREFIX)}
    helps = {k: v for k, v in e.helps.items() if k.startswith(SPEC_PREFIX)}
    series = {(s.name, tuple(sorted(s.labels))) for s in e.samples
              if s.name.startswith(SPEC_PREFIX)}
    return types, helps, series


def test_spec_families_match_vllm_sample(sample_prom: str, fake_vllm) -> None:
    fake_vllm.advance([4, 2, 0])
    body = urllib.request.urlopen(fake_vllm.metrics_url, timeout=5).read().decode()
    assert _shape(body) == _shape(sample_prom)
    # same numbers as the sample, since it was made from the same three drafts
    assert figures.stats(body) == figures.stats(sample_prom)
    # same series, label values included, except the _created timestamps
    fake_lines = {ln.rsplit(" ", 1)[0] for ln in body.splitlines() if ln.startswith(SPEC_PREFIX)}
    real_lines = {ln.rsplit(" ", 1)[0] for ln in sample_prom.splitlines()
                  if ln.startswith(SPEC_PREFIX)}
    assert fake_lines == real_lines
    # and the order of the families as vLLM writes them
    order = [ln.split()[2] for ln in body.splitlines() if ln.startswith("# TYPE " + SPEC_PREFIX)]
    real = [ln.split()[2] for ln in sample_prom.splitlines()
            if ln.startswith("# TYPE " + SPEC_PREFIX)]
    assert order == real


def test_other_families_keep_vllm_types(sample_prom: str, fake_vllm) -> None:
    real = exposition.parse_exposition(sample_prom).types
    fake = exposition.parse_exposition(fake_vllm.exposition()).types
    for name, kind in fake.items():
        assert real.get(name) == kind, name


def test_driving_the_counters(fake_vllm) -> None:
    before = spec_decode.spec_snapshot(fake_vllm.exposition())
    drawn = fake_vllm.advance_random(500, acceptance=0.8)
    after = spec_decode.spec_snapshot(fake_vllm.exposition())
    f = figures.figures(after, before)
    assert f["drafts"] == 500
    assert f["hit_rate"] == pytest.approx(sum(1 for n in drawn if n) / 500)
    assert f["hit_rate"] == pytest.approx(0.8, abs=0.06)
    fake_vllm.set_counters(3, 12, 6, [2, 2, 1, 1])
    assert figures.stats(fake_vllm.exposition())["error_propagation_rate"] == pytest.approx(1 / 3)
    fake_vllm.restart(k=2)
    assert figures.stats(fake_vllm.exposition())["hit_rate"] is None
    fake_vllm.advance([2, 1])
    assert figures.stats(fake_vllm.exposition())["num_speculative_tokens"] == 2
    with pytest.raises(ValueError):
        fake_vllm.advance([3])


def test_spec_off_has_no_spec_families() -> None:
    from support.fake_vllm import FakeVLLM

    e = exposition.parse_exposition(FakeVLLM(k=0).exposition())
    assert not [n for n in e.types if n.startswith(SPEC_PREFIX)]
    assert "vllm:num_requests_running" in e.types


def test_endpoints(fake_vllm) -> None:
    assert urllib.request.urlopen(fake_vllm.url + "/health", timeout=5).status == 200
    models = json.load(urllib.request.urlopen(fake_vllm.url + "/v1/models", timeout=5))
    assert models["data"][0]["id"] == "dsv3-tiny"
    fake_vllm.set_healthy(False)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(fake_vllm.url + "/health", timeout=5)
    assert err.value.code == 503
