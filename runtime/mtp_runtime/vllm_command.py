"""The one place that turns a pool's settings into the `vllm serve` command line and environment.

Pure and shared by the operator (which shows the command in the pool Deployment's
`mtp-operator.io/vllm-command` annotation) and the runtime (which runs it), so what the
operator reports is exactly what the pod runs. The rules follow vLLM 0.33.0:
K is always explicit; K = 0 means no `--speculative-config` at all; above the model's MTP
depth K must be a multiple of it; model-specific MTP method names are aliases of `mtp`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from mtp_runtime.gpu_profiles import valid_k_for_depth
from mtp_runtime.problems import Problem, problems_text

# vLLM 0.33.0 accepts these as MTP methods: the canonical name and its deprecated aliases.
MTP_METHODS: frozenset[str] = frozenset(
    {
        "mtp",
        "deepseek_mtp",
        "dots3_note_mtp",
        "mimo_mtp",
        "mimo_v2_mtp",
        "glm4_moe_mtp",
        "glm4_moe_lite_mtp",
        "glm_ocr_mtp",
        "glm5_next_mtp",
        "ernie_mtp",
        "nemotron_h_mtp",
        "exaone_moe_mtp",
        "exaone4_5_mtp",
        "qwen3_next_mtp",
        "qwen4_exp_mtp",
        "qwen3_5_mtp",
        "longcat_flash_mtp",
        "bailing_hybrid_v3_mtp",
        "bailing_hybrid_mtp",
        "minimax_m3_mtp",
        "kimi_k3_mtp",
        "pangu_ultra_moe_mtp",
        "step3p5_mtp",
        "step5_mtp",
        "hy_v3_mtp",
        "hy_v4_mtp",
        "gemma4_mtp",
        "inkling_mtp",
    }
)

MODEL_SOURCES = ("huggingface", "modelscope")
DEFAULT_PORT = 8000

# Flags the operator sets itself; in extraArgs they would contradict the pool's settings.
RESERVED_FLAGS: frozenset[str] = frozenset(
    {
        "--port",
        "--tensor-parallel-size",
        "-tp",
        "--max-model-len",
        "--reasoning-parser",
        "--served-model-name",
        "--speculative-config",
        "-sc",
        "--spec-method",
        "--spec-tokens",
    }
)


@dataclass(frozen=True)
class ServeSettings:
    """Everything that decides a pool's vLLM command line."""

    model: str
    num_speculative_tokens: int
    method: str = "mtp"
    port: int = DEFAULT_PORT
    tensor_parallel_size: int = 1
    max_model_len: str | None = None
    reasoning_parser: str | None = None
    served_model_name: str | None = None
    model_source: str = "huggingface"
    mtp_layers: int | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ServeSettings:
        data = json.loads(text)
        data["extra_args"] = tuple(data.get("extra_args") or ())
        return cls(**data)


class SettingsError(ValueError):
    """Settings vLLM would refuse; each entry of `problems` is `(field, message)`."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__(problems_text(self.problems))


def _flag_name(arg: str) -> str:
    """`--max_model_len=8k` → `--max-model-len`, `-sc.method` → `-sc`: the flag vLLM sees
    (its FlexibleArgumentParser accepts underscores for dashes in long options)."""
    name = arg.split("=", 1)[0].split(".", 1)[0]
    return name.replace("_", "-") if name.startswith("--") else name


def problems(s: ServeSettings) -> list[Problem]:
    """Every reason vLLM 0.33.0 would refuse these settings, named by spec field."""
    found: list[Problem] = []
    if not s.model.strip():
        found.append(Problem("model", "must not be empty"))
    if s.num_speculative_tokens < 0:
        found.append(Problem("speculative.numSpeculativeTokens", "must be 0 (off) or more"))
    if s.num_speculative_tokens > 0 and s.method not in MTP_METHODS:
        found.append(
            Problem("speculative.method", f"{s.method!r} is not an MTP method vLLM 0.33.0 accepts")
        )
    if not valid_k_for_depth(s.num_speculative_tokens, s.mtp_layers):
        found.append(
            Problem(
                "speculative.numSpeculativeTokens",
                f"{s.num_speculative_tokens} is not valid for mtpLayers={s.mtp_layers}: above "
                "the model's MTP depth K must be a multiple of it",
            )
        )
    if s.tensor_parallel_size < 1:
        found.append(Problem("tensorParallelSize", "must be at least 1"))
    if s.model_source not in MODEL_SOURCES:
        found.append(Problem("modelSource", f"must be one of {', '.join(MODEL_SOURCES)}"))
    for arg in s.extra_args:
        flag, written = _flag_name(arg), arg.split("=", 1)[0]
        if flag in RESERVED_FLAGS:
            shown = flag if written == flag else f"{written} ({flag})"
            found.append(
                (
                    "extraArgs",
                    f"{shown} is set by the operator from the spec; use "
                    "the matching spec field instead",
                )
            )
    return found


def validate(s: ServeSettings) -> None:
    found = problems(s)
    if found:
        raise SettingsError(found)


def speculative_config(method: str, k: int) -> dict[str, object] | None:
    """The `--speculative-config` object, or None when speculation is off (K = 0)."""
    if k <= 0:
        return None
    return {"method": method, "num_speculative_tokens": k}


def build_argv(s: ServeSettings) -> list[str]:
    """The exact `vllm serve` argv for these settings (validated first)."""
    validate(s)
    argv = ["vllm", "serve", s.model, "--port", str(s.port)]
    argv += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    if s.max_model_len is not None:
        argv += ["--max-model-len", str(s.max_model_len)]
    if s.reasoning_parser:
        argv += ["--reasoning-parser", s.reasoning_parser]
    if s.served_model_name:
        argv += ["--served-model-name", s.served_model_name]
    spec = speculative_config(s.method, s.num_speculative_tokens)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    return argv + list(s.extra_args)


def build_env(s: ServeSettings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment vLLM needs on top of `base` (the model source switch)."""
    env = dict(base or {})
    if s.model_source == "modelscope":
        env["VLLM_USE_MODELSCOPE"] = "true"
    return env
