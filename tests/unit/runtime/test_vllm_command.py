"""The `vllm serve` command line (mtp_runtime.vllm_command, shared with the operator)."""

from __future__ import annotations

import json
import shlex

import pytest

from mtp_runtime.vllm_command import (
    MTP_METHODS,
    RESERVED_FLAGS,
    ServeSettings,
    SettingsError,
    build_argv,
    build_env,
    problems,
    validate,
)

pytestmark = pytest.mark.unit

SEED_COMMAND = (
    "vllm serve Qwen/Qwen3.6-27B --port 8000 --tensor-parallel-size 8 --max-model-len 262144 "
    "--reasoning-parser qwen3 --speculative-config "
    '\'{"method":"qwen3_next_mtp","num_speculative_tokens":2}\''
)
SEED = ServeSettings(model="Qwen/Qwen3.6-27B", num_speculative_tokens=2, method="qwen3_next_mtp",
                     port=8000, tensor_parallel_size=8, max_model_len="262144",
                     reasoning_parser="qwen3", model_source="modelscope")


def test_seed_command_exactly() -> None:
    assert build_argv(SEED) == shlex.split(SEED_COMMAND)
    assert shlex.join(build_argv(SEED)) == SEED_COMMAND
    assert build_env(SEED) == {"VLLM_USE_MODELSCOPE": "true"}


def test_k_zero_means_no_speculative_config() -> None:
    argv = build_argv(ServeSettings(model="m", num_speculative_tokens=0))
    assert "--speculative-config" not in argv
    assert argv == ["vllm", "serve", "m", "--port", "8000", "--tensor-parallel-size", "1"]


def test_k_always_explicit() -> None:
    for k in (1, 2, 4, 6):
        argv = build_argv(ServeSettings(model="m", num_speculative_tokens=k))
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec == {"method": "mtp", "num_speculative_tokens": k}


def test_optional_flags_env_and_extra_args() -> None:
    s = ServeSettings(model="m", num_speculative_tokens=1, served_model_name="chat",
                      extra_args=("--gpu-memory-utilization", "0.9"))
    argv = build_argv(s)
    assert argv[argv.index("--served-model-name") + 1] == "chat"
    assert argv[-2:] == ["--gpu-memory-utilization", "0.9"]
    assert build_env(s, {"A": "1"}) == {"A": "1"}


@pytest.mark.parametrize(
    ("settings", "field", "text"),
    [
        (ServeSettings(model="m", num_speculative_tokens=3, mtp_layers=2),
         "speculative.numSpeculativeTokens", "multiple"),
        (ServeSettings(model="m", num_speculative_tokens=2, method="medusa"),
         "speculative.method", "medusa"),
        (ServeSettings(model="m", num_speculative_tokens=-1),
         "speculative.numSpeculativeTokens", "0 (off)"),
        (ServeSettings(model=" ", num_speculative_tokens=1), "model", "empty"),
        (ServeSettings(model="m", num_speculative_tokens=1, tensor_parallel_size=0),
         "tensorParallelSize", "at least 1"),
        (ServeSettings(model="m", num_speculative_tokens=1, model_source="s3"),
         "modelSource", "huggingface"),
        (ServeSettings(model="m", num_speculative_tokens=1, extra_args=("--port=9",)),
         "extraArgs[0]", "--port"),
        (ServeSettings(model="m", num_speculative_tokens=1,
                       extra_args=("-sc.num_speculative_tokens", "3")), "extraArgs[0]", "-sc"),
    ],
)
def test_problems(settings: ServeSettings, field: str, text: str) -> None:
    found = problems(settings)
    assert any(f == field and text in msg for f, msg in found), found
    with pytest.raises(SettingsError):
        validate(settings)
    with pytest.raises(SettingsError):
        build_argv(settings)


def test_method_table_follows_facts() -> None:
    assert "mtp" in MTP_METHODS and "qwen3_next_mtp" in MTP_METHODS
    assert "deepseek_mtp" in MTP_METHODS
    assert len(MTP_METHODS) == 28  # canonical + 27 aliases in FACTS.md
    assert not {"medusa", "mlp_speculator", "eagle", "ngram"} & MTP_METHODS
    assert {"--port", "--speculative-config", "-sc"} <= RESERVED_FLAGS


def test_settings_json_round_trip() -> None:
    assert ServeSettings.from_json(SEED.to_json()) == SEED


def test_k_from_argv_reads_what_build_argv_writes() -> None:
    from mtp_runtime.vllm_command import k_from_argv

    for k in (0, 1, 3, 6):
        s = ServeSettings(model="org/m", num_speculative_tokens=k, method="mtp")
        assert k_from_argv(build_argv(s)) == k
    assert k_from_argv(["vllm", "serve", "m", "--speculative-config", "not json"]) == 0
    assert k_from_argv(["vllm", "serve", "m", "--speculative-config"]) == 0
