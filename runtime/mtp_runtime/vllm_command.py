"""The one place that turns a pool's settings into the `vllm serve` command line and environment.

Pure and shared by the operator (which shows the command in the pool Deployment's
`mtp-operator.io/vllm-command` annotation) and the runtime (which runs it), so what the
operator reports is exactly what the pod runs. The rules follow vLLM 0.33.0:
K is always explicit; K = 0 means no `--speculative-config` at all; above the model's MTP
depth K must be a multiple of it; model-specific MTP method names are aliases of `mtp`.
"""

from __future__ import annotations

import json
import re
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
# The largest K the operator plans: the shipped Prometheus rules compute error propagation for
# K <= 16, and deeper drafts than that have no MTP model to pay off on.
MAX_SPECULATIVE_TOKENS = 16
# The pool pod's ports, the one home of both numbers: vLLM's OpenAI API and /metrics (`http`),
# and the MTP exporter's /metrics (`metrics`, mtp_runtime.exporter). The operator's Services,
# probes and scrapes and the runtime's CLI defaults all read them from here.
DEFAULT_PORT = 8000
EXPORTER_PORT = 9400

# Flags the operator sets itself; in extraArgs they would contradict the pool's settings.
SPEC_FLAGS: frozenset[str] = frozenset(
    {
        "--model",
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
# Flags that would break a pool: one pool is one model on tensorParallelSize GPUs per replica,
# spread by its Deployment, not by vLLM's pipeline or data parallelism.
BREAKING_FLAGS: frozenset[str] = frozenset(
    {"--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp"}
)
# `--config FILE` reads flags from a YAML file, reserved ones included, where no check sees them.
CONFIG_FLAGS: frozenset[str] = frozenset({"--config"})
RESERVED_FLAGS: frozenset[str] = SPEC_FLAGS | BREAKING_FLAGS | CONFIG_FLAGS

# What `model` and `servedModelName` may be: a Hugging Face / ModelScope id (`org/name`, `name`)
# or a path (`/models/x`). Never starting with `-` (vLLM would parse the value as a flag:
# `-pp=2`, `--trust-remote-code`), no whitespace or control characters. One anchored plain
# class, read alike by Python, pydantic and the API server's RE2 (the CRD's `pattern`).
MODEL_ID_PATTERN = r"^[A-Za-z0-9_./][-A-Za-z0-9_./:@+]*$"
_MODEL_ID_RE = re.compile(MODEL_ID_PATTERN.removesuffix("$") + r"\Z")
MODEL_ID_MESSAGE = (
    "must be a Hugging Face or ModelScope id (`org/name`) or a path: letters, digits and "
    "`-_./:@+`, not starting with `-` (vLLM would read it as a flag)"
)


def _prefix_pattern(body: str) -> str:
    """RE2/Python regex for every non-empty prefix of `body`, `-` also written `_`."""
    out = ""
    for ch in reversed(body):
        c = "[-_]" if ch == "-" else re.escape(ch)
        out = f"{c}({out})?" if out else c
    return out


def reserved_pattern() -> str:
    """One regex (RE2 and Python `re` alike) that finds a reserved flag in an extraArgs entry in
    every spelling vLLM's parser would take for it: `--flag`, `--flag=value`,
    `--flag.key` (dotted JSON keys), underscores for dashes, an abbreviation (argparse expands
    a unique prefix, and refuses an ambiguous one anyway), and a flag after whitespace in an
    entry that starts with a flag (`"--enforce-eager --port 9000"`; an entry that does not
    start with `-` is a value). The API server's CEL rule is generated from it."""
    long_flags = sorted(f[2:] for f in RESERVED_FLAGS if f.startswith("--"))
    short_flags = sorted(f[1:] for f in RESERVED_FLAGS if not f.startswith("--"))
    longs = "|".join(_prefix_pattern(b) for b in long_flags)
    shorts = "|".join(re.escape(b) for b in short_flags)
    return rf"^(-\S*\s+(\S+\s+)*)?(--({longs})|-({shorts}))([=.\s]|$)"


_RESERVED_RE = re.compile(reserved_pattern())


def reserved_flags_in(arg: str) -> list[tuple[str, str]]:
    """(as written, reserved flag) for each reserved flag `arg` sets, in any spelling."""
    found: list[tuple[str, str]] = []
    if not arg.startswith("-"):
        return found  # a value, not a flag
    for token in arg.split():
        written = token.split("=", 1)[0]
        name = written.split(".", 1)[0]
        if name.startswith("--") and len(name) > 2:
            norm = name.replace("_", "-")
            hits = sorted(f for f in RESERVED_FLAGS if f.startswith("--") and f.startswith(norm))
        elif name.startswith("-") and not name.startswith("--"):
            hits = [name] if name in RESERVED_FLAGS else []
        else:
            hits = []
        if hits:
            exact = next((h for h in hits if h == name.replace("_", "-")), None)
            found.append((written, exact or " or ".join(hits)))
    return found


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
    # vLLM's num_speculative_tokens_per_batch_size: (first batch size, last, K) ranges
    batch_size_schedule: tuple[tuple[int, int, int], ...] = field(default_factory=tuple)
    # a replica over several nodes (spec.fit, a LeaderWorkerSet group): pipeline stages and
    # pods; each pod's rank and the leader's address come from LWS at start (multinode.py)
    pipeline_parallel_size: int = 1
    nnodes: int = 1

    def __post_init__(self) -> None:  # JSON gives lists; the settings stay hashable
        schedule = tuple(tuple(int(x) for x in entry) for entry in self.batch_size_schedule)
        object.__setattr__(self, "batch_size_schedule", schedule)

    def to_json(self) -> str:
        data = asdict(self)
        if not data["batch_size_schedule"]:  # absent unless set: older settings hash the same
            del data["batch_size_schedule"]
        for name in ("pipeline_parallel_size", "nnodes"):  # likewise: 1 is absent
            if data[name] == 1:
                del data[name]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

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


def problems(s: ServeSettings) -> list[Problem]:
    """Every reason vLLM 0.33.0 would refuse these settings, named by spec field."""
    found: list[Problem] = []
    if not s.model.strip():
        found.append(Problem("model", "must not be empty"))
    elif not _MODEL_ID_RE.match(s.model):
        found.append(Problem("model", MODEL_ID_MESSAGE))
    if s.served_model_name is not None and not _MODEL_ID_RE.match(s.served_model_name):
        found.append(Problem("servedModelName", MODEL_ID_MESSAGE))
    if s.num_speculative_tokens < 0:
        found.append(Problem("speculative.numSpeculativeTokens", "must be 0 (off) or more"))
    if s.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
        found.append(
            Problem("speculative.numSpeculativeTokens", f"must be at most {MAX_SPECULATIVE_TOKENS}")
        )
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
    found += schedule_problems(s.batch_size_schedule, s.mtp_layers)
    if s.tensor_parallel_size < 1:
        found.append(Problem("tensorParallelSize", "must be at least 1"))
    if s.pipeline_parallel_size < 1 or s.nnodes < 1:
        found.append(Problem("fit", "pipeline stages and nodes per replica must be at least 1"))
    elif (s.tensor_parallel_size * s.pipeline_parallel_size) % s.nnodes:
        found.append(Problem("fit", f"{s.nnodes} nodes do not split tensor x pipeline "
                             f"{s.tensor_parallel_size} x {s.pipeline_parallel_size} GPUs evenly"))
    if s.model_source not in MODEL_SOURCES:
        found.append(Problem("modelSource", f"must be one of {', '.join(MODEL_SOURCES)}"))
    for i, arg in enumerate(s.extra_args):
        for written, flag in reserved_flags_in(arg):
            shown = flag if written == flag else f"{written} ({flag})"
            if flag in BREAKING_FLAGS:
                why = "would break the pool (one pool: tensorParallelSize GPUs per replica)"
            elif flag in CONFIG_FLAGS:
                why = ("reads flags from a file, reserved ones included; write them in "
                       "extraArgs instead")
            else:
                why = "is set by the operator from the spec; use the matching spec field instead"
            found.append(Problem(f"extraArgs[{i}]", f"{shown} {why}"))
    return found


def schedule_problems(
    schedule: Sequence[Sequence[int]], mtp_layers: int | None
) -> list[Problem]:
    """vLLM 0.33's rules for num_speculative_tokens_per_batch_size, named by spec field:
    inclusive (first, last, K) ranges, positive, sorted, not overlapping, the first from 1."""
    field_name = "speculative.batchSizeSchedule"
    found: list[Problem] = []
    previous_end = 0
    for i, entry in enumerate(schedule):
        if len(entry) != 3:
            found.append(Problem(f"{field_name}[{i}]", "must be (first, last, K)"))
            continue
        first, last, k = entry
        if first <= 0 or last <= 0 or first > last:
            found.append(Problem(f"{field_name}[{i}]",
                                 f"batch sizes {first}..{last} must be positive, first <= last"))
        if first <= previous_end:
            found.append(Problem(f"{field_name}[{i}]",
                                 "ranges must be sorted and must not overlap"))
        # our own rule (vLLM 0.33 accepts a gap): a batch of one request would run no known K
        if i == 0 and first != 1:
            found.append(Problem(f"{field_name}[0]", "the first range must start at batch 1"))
        if k < 0 or not valid_k_for_depth(k, mtp_layers):
            found.append(Problem(f"{field_name}[{i}]",
                                 f"K={k} must be 0 or more and valid for mtpLayers={mtp_layers}"))
        elif k > MAX_SPECULATIVE_TOKENS:
            found.append(Problem(f"{field_name}[{i}]",
                                 f"K={k} must be at most {MAX_SPECULATIVE_TOKENS}"))
        previous_end = max(previous_end, last)
    return found


def validate(s: ServeSettings) -> None:
    found = problems(s)
    if found:
        raise SettingsError(found)


def speculative_config(
    method: str, k: int, schedule: Sequence[Sequence[int]] = ()
) -> dict[str, object] | None:
    """The `--speculative-config` object, or None when speculation is off (K = 0). With a
    batch-size schedule vLLM picks K per engine step from it, each capped at K."""
    if k <= 0:
        return None
    out: dict[str, object] = {"method": method, "num_speculative_tokens": k}
    if schedule:
        out["num_speculative_tokens_per_batch_size"] = [list(e) for e in schedule]
    return out


def k_from_argv(argv: Sequence[str]) -> int:
    """K in an argv `build_argv` wrote (0 without speculation or when it cannot be read)."""
    try:
        spec = json.loads(argv[list(argv).index("--speculative-config") + 1])
        return int(spec.get("num_speculative_tokens", 0))
    except (ValueError, TypeError, IndexError, AttributeError):
        return 0


def build_argv(s: ServeSettings) -> list[str]:
    """The exact `vllm serve` argv for these settings (validated first)."""
    validate(s)
    argv = ["vllm", "serve", s.model, "--port", str(s.port)]
    argv += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    if s.pipeline_parallel_size > 1:
        argv += ["--pipeline-parallel-size", str(s.pipeline_parallel_size)]
    if s.nnodes > 1:  # vLLM's multiprocessing backend over nodes; the rank is the pod's
        argv += ["--nnodes", str(s.nnodes)]
    if s.max_model_len is not None:
        argv += ["--max-model-len", str(s.max_model_len)]
    if s.reasoning_parser:
        argv += ["--reasoning-parser", s.reasoning_parser]
    if s.served_model_name:
        argv += ["--served-model-name", s.served_model_name]
    spec = speculative_config(s.method, s.num_speculative_tokens, s.batch_size_schedule)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    return argv + list(s.extra_args)


def build_env(s: ServeSettings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment vLLM needs on top of `base` (the model source switch)."""
    env = dict(base or {})
    if s.model_source == "modelscope":
        env["VLLM_USE_MODELSCOPE"] = "true"
    return env
