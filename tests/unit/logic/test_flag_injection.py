"""Free-text fields that reach `vllm serve` must not become flags (issue 36): a model or
served name that starts with `-` is parsed by vLLM as an option (`-pp=2`,
`--trust-remote-code`), and `--config FILE` loads a YAML file that can set any flag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mtp_operator.validation import spec_problems
from mtp_runtime.vllm_command import ServeSettings, problems, reserved_flags_in

REPO = Path(__file__).resolve().parents[3]
CRD_FILE = REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"

GOOD = ["Qwen/Qwen3.6-27B", "deepseek-ai/DeepSeek-V3", "gpt2", "/models/x", "/models/my_model.v2",
        "XiaomiMiMo/MiMo-7B-RL", "org/name-1.5_b", "./local-model"]
BAD = ["-pp=2", "--trust-remote-code", "-", "--config", "a b", "org/name ", " org/name",
       "name\n--trust-remote-code", "tab\tname", "nul\x00", "bell\x07", "", "-x/y", "name\n"]


@pytest.mark.parametrize("value", GOOD)
def test_model_ids_and_paths_are_accepted(value: str) -> None:
    assert problems(ServeSettings(model=value, num_speculative_tokens=2)) == []
    assert problems(ServeSettings(model="m", num_speculative_tokens=2,
                                  served_model_name=value)) == []
    _, found = spec_problems({"model": value, "servedModelName": value})
    assert found == []


@pytest.mark.parametrize("value", BAD)
def test_a_flag_or_blank_in_model_or_served_name_is_refused(value: str) -> None:
    assert "model" in [p.field for p in problems(ServeSettings(model=value,
                                                               num_speculative_tokens=2))]
    found = problems(ServeSettings(model="m", num_speculative_tokens=2, served_model_name=value))
    assert [p.field for p in found] == ["servedModelName"]
    _, found = spec_problems({"model": value})
    assert [f for f, _ in found] == ["model"]
    _, found = spec_problems({"model": "m", "servedModelName": value})
    assert [f for f, _ in found] == ["servedModelName"]


def test_the_crd_refuses_them_too() -> None:
    (version,) = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"]
    props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for name in ("model", "servedModelName"):
        # anchored, one plain class: RE2 (the API server) and Python read it alike, except
        # that Python's `$` also matches before a final newline, which RE2's does not
        pattern = re.compile(props[name]["pattern"].removesuffix("$") + r"\Z")
        for value in GOOD:
            assert pattern.search(value), (name, value)
        for value in BAD:
            assert not pattern.search(value), (name, value)


@pytest.mark.parametrize("arg", ["--config", "--config=file.yaml", "--config file.yaml",
                                 "--confi=x", "--conf", "--enforce-eager --config f"])
def test_config_file_flag_is_reserved(arg: str) -> None:
    found = problems(ServeSettings(model="m", num_speculative_tokens=2, extra_args=(arg,)))
    assert [p.field for p in found] == ["extraArgs[0]"]
    assert "--config" in found[0].message


def test_config_format_is_not_the_config_flag() -> None:
    assert reserved_flags_in("--config-format=hf") == []
