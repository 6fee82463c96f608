"""The project carries copies of reference data (real vLLM 0.33.0 output, tiny model configs);
where the workplace's shared/ folder lies beside the checkout, the copies must equal it."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "vllm-0.33.0"
COPIES = REPO / "tests" / "fixtures" / "vllm-0.33.0"


@pytest.mark.parametrize("name", ["metrics-sample.prom", "FACTS.md"])
def test_copy_matches_shared(name: str) -> None:
    ours = COPIES / name
    assert ours.is_file(), f"{ours} missing: the project must carry its own copy"
    if not (SHARED / name).is_file():
        pytest.skip("shared/ is not beside this checkout; the carried copy is used as is")
    assert ours.read_bytes() == (SHARED / name).read_bytes()
