"""Contract with the real vLLM 0.33.0: every command line we generate passes vLLM's own checks.

Each argv our code builds (the profile table on several GPUs, K = 0/1/2/4/6, MTP depth 1 and 2,
the seed command, and the examples/*.yaml pools rendered by `mtp-operator render`) is run
through vLLM 0.33.0's own serve parser, serve-args validation, reasoning-parser registry and
engine-config validation, on CPU, in a separate venv (install_vllm.sh; vLLM never enters the
project's own environment). One driver process imports vLLM once for all cases.

For the engine-config step the model positional is replaced by a local tiny config
(tests/fixtures/tiny-models: dsv3-tiny has 2 MTP layers, qwen3next-tiny 1), chosen by the
pool's MTP depth, and --tensor-parallel-size is capped at 4 because the tiny models have 4
attention heads (vLLM requires heads % TP == 0; the real models have more). The unchanged argv
is also parsed (parser + serve-args validation) as generated. --reasoning-parser is checked
against vLLM's registry and removed for the engine-config step (see vllm_driver.py: vLLM then
wants the model's tokenizer, which config-only models lack).

Invalid K (3 with MTP depth 2) must be caught by OUR validation first with a clearer message,
and vLLM must reject it too.

Env: MTP_VLLM_PYTHON=/path/to/python (use that vLLM venv), else install_vllm.sh is run (it
reuses ~/.cache/mtp-operator/vllm-0.33.0-py3.11-venv when warm; ~3 min cold).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mtp_runtime.gpu_detect import assumed
from mtp_runtime.gpu_profiles import KError, KRequest, resolve_k
from mtp_runtime.launcher import plan
from mtp_runtime.pool_config import PoolConfig
from mtp_runtime.vllm_command import (
    RESERVED_FLAGS,
    ServeSettings,
    SettingsError,
    build_argv,
    problems,
    reserved_flags_in,
    reserved_pattern,
)
from support.scripts import load

pytestmark = pytest.mark.contract

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TINY = REPO / "tests" / "fixtures" / "tiny-models"
MAX_TINY_TP = 4  # the tiny models' num_attention_heads

PRODUCTS = (
    "NVIDIA-H200",
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-L40S",
    "NVIDIA-A10G",
    "Tesla-T4",
    "NVIDIA-RTX-4090",  # not in the table: DEFAULT_K
    "A100-SXM4-40GB-MIG-1g.5gb",
)
MODELS = (  # (tiny model, MTP depth, method as users write it, a real model of that kind)
    ("dsv3-tiny", 2, "deepseek_mtp", "deepseek-ai/DeepSeek-V3"),
    ("dsv3-tiny", 2, "mtp", "deepseek-ai/DeepSeek-V3"),
    ("qwen3next-tiny", 1, "qwen3_next_mtp", "Qwen/Qwen3-Next-80B-A3B-Instruct"),
)
SEED = ServeSettings(model="Qwen/Qwen3.6-27B", num_speculative_tokens=2, method="qwen3_next_mtp",
                     port=8000, tensor_parallel_size=8, max_model_len="262144",
                     reasoning_parser="qwen3", model_source="modelscope")


def tiny_model(mtp_layers: int | None) -> str:
    """The tiny config with the pool's MTP depth (depth 1 accepts any K, so it stands for
    pools whose depth is unknown too)."""
    return "dsv3-tiny" if mtp_layers == 2 else "qwen3next-tiny"


def for_contract(argv: list[str], tiny: str) -> list[str]:
    out = list(argv)
    out[2] = str(TINY / tiny)
    if "--tensor-parallel-size" in out:
        i = out.index("--tensor-parallel-size") + 1
        out[i] = str(min(int(out[i]), MAX_TINY_TP))
    return out


def spec_k(argv: list[str]) -> int:
    if "--speculative-config" not in argv:
        return 0
    return json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]


def generated_cases() -> list[dict[str, object]]:
    cases: list[dict[str, object]] = []

    def add(case_id: str, s: ServeSettings) -> None:
        argv = build_argv(s)  # our validation runs here: every case is one we would generate
        tiny = tiny_model(s.mtp_layers)
        cases.append({"id": case_id, "argv": for_contract(argv, tiny), "engine": True,
                      "expect_k": s.num_speculative_tokens, "generated": argv})
        cases.append({"id": case_id + "/as-generated", "argv": argv, "engine": False})

    # the profile table: K as resolve_k picks it for each GPU and depth
    for product in PRODUCTS:
        for tiny, depth, method, real in MODELS:
            k = resolve_k(product, KRequest(mtp_layers=depth)).k
            s = ServeSettings(model=real, num_speculative_tokens=k, method=method,
                              mtp_layers=depth, tensor_parallel_size=2)
            add(f"profile/{product}/{tiny}/{method}/K{k}", s)
    # explicit K, with the other flags we generate
    for k in (0, 1, 2, 4, 6):
        for tiny, depth, method, real in MODELS:
            s = ServeSettings(
                model=real, num_speculative_tokens=k, method=method, mtp_layers=depth,
                tensor_parallel_size=4 if k % 2 else 1, max_model_len="32k",
                reasoning_parser="qwen3" if "qwen" in tiny else "deepseek_r1",
                served_model_name="chat", model_source="modelscope" if k == 2 else "huggingface",
                extra_args=("--gpu-memory-utilization", "0.9"),
            )
            add(f"explicit/{tiny}/{method}/K{k}", s)
    add("seed", SEED)
    # speculative.batchSizeSchedule: vLLM's num_speculative_tokens_per_batch_size, with MTP
    for tiny, depth, method, real in MODELS:
        k = 2 * depth
        s = ServeSettings(model=real, num_speculative_tokens=k, method=method, mtp_layers=depth,
                          batch_size_schedule=((1, 4, k), (5, 64, depth), (65, 1024, 0)))
        add(f"schedule/{tiny}/{method}/K{k}", s)
    # the real-size sweep's pools (bench/gpu/realsize.py), which ran on vLLM 0.26.0 on the GPU:
    # the same argv must hold on 0.33 (the flags it passes in extraArgs exist in both)
    realsize_models = load("bench/gpu/realsize_models.py")

    for kind in sorted(realsize_models.KINDS):
        for k in range(7):
            extra = (*realsize_models.COMMON_ARGS, *realsize_models.KIND_ARGS[kind],
                     "--gpu-memory-utilization", "0.90", "--max-num-seqs", "128")
            s = ServeSettings(model=f"/models/{kind}", num_speculative_tokens=k,
                              method=realsize_models.METHODS[kind], max_model_len="1024",
                              served_model_name="m", mtp_layers=1, extra_args=extra)
            add(f"realsize/{kind}/K{k}", s)
    return cases


CASES = generated_cases()


def negative_cases() -> list[dict[str, object]]:
    dsv3 = str(TINY / "dsv3-tiny")
    return [
        {"id": "neg/schedule-not-from-1", "engine": True, "argv": [
            "vllm", "serve", dsv3, "--speculative-config",
            '{"method":"mtp","num_speculative_tokens":2,'
            '"num_speculative_tokens_per_batch_size":[[2,8,2]]}']},
        {"id": "neg/k3-depth2", "engine": True, "argv": [
            "vllm", "serve", dsv3, "--speculative-config",
            '{"method":"mtp","num_speculative_tokens":3}']},
        {"id": "neg/medusa", "engine": True, "argv": [
            "vllm", "serve", dsv3, "--speculative-config",
            '{"method":"medusa","num_speculative_tokens":2}']},
        {"id": "neg/no-k", "engine": True, "argv": [
            "vllm", "serve", dsv3, "--speculative-config", '{"method":"mtp"}']},
        {"id": "neg/bad-reasoning-parser", "engine": True, "argv": [
            "vllm", "serve", dsv3, "--reasoning-parser", "qwen3x"]},
    ]


# ---------------------------------------------------------------------------------------------
# examples/*.yaml through `mtp-operator render`


def render_examples() -> tuple[list[dict[str, object]], str | None]:
    """Cases from the examples' rendered pool Deployments, or ([], why not)."""
    examples = sorted((REPO / "examples").glob("*.yaml"))
    if not examples:
        return [], "no examples/*.yaml yet"
    probe = subprocess.run([sys.executable, "-m", "mtp_operator.cli", "render", "--help"],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
    if probe.returncode != 0:
        return [], f"`mtp-operator render` is not available: {probe.stderr.strip()[-300:]}"
    import yaml  # an operator dependency, present where mtp-operator is

    cases: list[dict[str, object]] = []
    for path in examples:
        proc = subprocess.run([sys.executable, "-m", "mtp_operator.cli", "render", "-f",
                               str(path)], capture_output=True, text=True, cwd=REPO, timeout=120)
        assert proc.returncode == 0, f"render {path.name}: {proc.stderr}"
        for obj in yaml.safe_load_all(proc.stdout):
            if not obj or obj.get("kind") != "Deployment":
                continue
            annotations = obj["metadata"].get("annotations") or {}
            command = annotations.get("mtp-operator.io/vllm-command")
            env = {e["name"]: e.get("value") for c in obj["spec"]["template"]["spec"]
                   ["containers"] for e in c.get("env", [])}
            if command is None or "MTP_RUNTIME_CONFIG" not in env:
                continue
            argv = json.loads(command)
            config = PoolConfig.from_json(env["MTP_RUNTIME_CONFIG"])
            cases.append({
                "id": f"example/{path.stem}/{obj['metadata']['name']}",
                "argv": for_contract(argv, tiny_model(config.serve.mtp_layers)),
                "engine": True, "expect_k": spec_k(argv), "generated": argv,
                "config": config,
            })
    if not cases:
        return [], "rendered examples have no pool Deployment with a vllm-command annotation"
    return cases, None


# ---------------------------------------------------------------------------------------------
# running vLLM


@pytest.fixture(scope="session")
def vllm_python() -> str:
    python = os.environ.get("MTP_VLLM_PYTHON")
    if python:
        return python
    if shutil.which("bash") is None:
        pytest.skip("bash is needed for install_vllm.sh")
    proc = subprocess.run(["bash", str(HERE / "install_vllm.sh")], capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"install_vllm.sh failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def examples() -> tuple[list[dict[str, object]], str | None]:
    return render_examples()


@pytest.fixture(scope="session")
def vllm_results(vllm_python: str, examples, tmp_path_factory) -> dict[str, object]:
    all_cases = CASES + negative_cases() + examples[0]
    payload = {"cases": [{k: c[k] for k in ("id", "argv", "engine")} for c in all_cases]}
    out = tmp_path_factory.mktemp("vllm") / "results.json"
    proc = subprocess.run([vllm_python, str(HERE / "vllm_driver.py"), str(out)],
                          input=json.dumps(payload), capture_output=True, text=True,
                          timeout=1200, env={**os.environ, "MTP_DRIVER_TRACEBACKS": "1"})
    assert proc.returncode == 0 and out.exists(), (
        f"vllm_driver.py failed ({proc.returncode}):\n{proc.stderr[-5000:]}")
    doc = json.loads(out.read_text())
    assert doc["vllm_version"] == "0.33.0"
    doc["by_id"] = {r["id"]: r for r in doc["results"]}
    return doc


def _check_accepted(case: dict[str, object], result: dict[str, object]) -> None:
    assert result["ok"], (
        f"vLLM 0.33.0 rejects {case['id']} at {result['stage']}: {result['error_type']}: "
        f"{result['error']}\nargv: {case['argv']}\n{result.get('traceback', '')}")
    if not case.get("engine"):
        return
    k = case["expect_k"]
    if k == 0:
        assert result["speculative"] is None
    else:
        assert result["speculative"] == {"method": "mtp", "num_speculative_tokens": k}


@pytest.mark.parametrize("case", CASES, ids=[str(c["id"]) for c in CASES])
def test_generated_argv_accepted_by_vllm(case: dict[str, object], vllm_results) -> None:
    _check_accepted(case, vllm_results["by_id"][case["id"]])


def test_reasoning_parsers_we_use_are_registered(vllm_results) -> None:
    assert "qwen3" in vllm_results["reasoning_parsers"]
    seen = {r["reasoning_parser"] for r in vllm_results["results"] if r["reasoning_parser"]}
    assert {"qwen3", "deepseek_r1"} <= seen
    for r in vllm_results["results"]:
        if r["reasoning_parser"] and not r["id"].startswith("neg/"):
            assert r["reasoning_parser_registered"], r


def test_invalid_k_caught_by_us_first_with_a_clearer_message(vllm_results) -> None:
    bad = ServeSettings(model="deepseek-ai/DeepSeek-V3", num_speculative_tokens=3,
                        mtp_layers=2)
    ours = problems(bad)
    assert ours and ours[0][0] == "speculative.numSpeculativeTokens"
    with pytest.raises(SettingsError):
        build_argv(bad)  # never reaches vLLM
    with pytest.raises(KError) as err:
        resolve_k("NVIDIA-H200", KRequest(num_speculative_tokens=3, mtp_layers=2))
    message = str(err.value)
    # ours names the spec field and the values that would work
    assert message.startswith("speculative.numSpeculativeTokens: 3 is not valid")
    assert "mtpLayers=2" in message and "(2, 4, 6, ...)" in message and "at most 2" in message
    # vLLM rejects it too, later (engine config), with its own terser message
    theirs = vllm_results["by_id"]["neg/k3-depth2"]
    assert not theirs["ok"] and theirs["stage"] == "engine_config"
    assert "num_speculative_tokens:3 must be divisible by n_predict=2" in theirs["error"]


def test_vllm_rejects_what_we_never_generate(vllm_results) -> None:
    by_id = vllm_results["by_id"]
    # a non-MTP method we refuse up front
    assert any(f == "speculative.method" for f, _ in problems(
        ServeSettings(model="m", num_speculative_tokens=2, method="medusa")))
    assert not by_id["neg/medusa"]["ok"]
    # K missing: we always write it (checked on every generated argv above)
    assert not by_id["neg/no-k"]["ok"]
    assert "num_speculative_tokens must be provided" in by_id["neg/no-k"]["error"]
    for case in CASES:
        if case.get("engine") and case["expect_k"]:
            assert '"num_speculative_tokens":' in " ".join(case["generated"])
    # an unknown reasoning parser: vLLM's registry says no
    bad_rp = by_id["neg/bad-reasoning-parser"]
    assert not bad_rp["ok"] and bad_rp["stage"] == "reasoning_parser"
    assert bad_rp["reasoning_parser_registered"] is False
    assert re.search(r"Reasoning parser 'qwen3x' not found", bad_rp["error"])


def test_examples_accepted_by_vllm(examples, vllm_results) -> None:
    cases, why_not = examples
    if why_not:
        pytest.skip(why_not)
    for case in cases:
        _check_accepted(case, vllm_results["by_id"][case["id"]])
        # what the operator annotates is exactly what the runtime will run on that GPU
        config: PoolConfig = case["config"]  # type: ignore[assignment]
        launch = plan(config, assumed(config.gpu_product))
        assert launch.argv == case["generated"], case["id"]


def test_seed_command_is_what_vllm_parses(vllm_results) -> None:
    as_generated = vllm_results["by_id"]["seed/as-generated"]
    assert as_generated["ok"], as_generated
    engine = vllm_results["by_id"]["seed"]
    assert engine["ok"] and engine["speculative"] == {"method": "mtp",
                                                      "num_speculative_tokens": 2}
    assert engine["max_model_len"] == 262144
    # and K 0 on the seed means no speculative config at all
    off = build_argv(replace(SEED, num_speculative_tokens=0))
    assert "--speculative-config" not in off


def test_tiny_models_are_copies_of_shared() -> None:
    shared = REPO.parent / "shared" / "vllm-0.33.0" / "tiny-models"
    if not shared.exists():
        pytest.skip("shared/ not beside the checkout")
    for name in ("dsv3-tiny", "qwen3next-tiny"):
        ours = json.loads((TINY / name / "config.json").read_text())
        assert ours == json.loads((shared / name / "config.json").read_text())


def test_batch_size_schedule_reaches_vllms_speculative_config(vllm_results) -> None:
    """vLLM 0.33 accepts the schedule with MTP and keeps it as we render it."""
    cases = [c for c in CASES if str(c["id"]).startswith("schedule/") and "generated" in c]
    assert cases
    for case in cases:
        result = vllm_results["by_id"][case["id"]]
        _check_accepted(case, result)
        argv = case["generated"]
        sc = json.loads(argv[argv.index("--speculative-config") + 1])
        assert result["per_batch_size"] == sc["num_speculative_tokens_per_batch_size"]


def test_a_schedule_not_from_batch_1_is_our_own_refusal(vllm_results) -> None:
    """vLLM 0.33 accepts a schedule whose first range starts above batch 1 (seen: ok); the
    operator refuses it by its own, stricter rule, with the field's path."""
    result = vllm_results["by_id"]["neg/schedule-not-from-1"]
    assert result["ok"], result
    found = problems(ServeSettings(model="m", num_speculative_tokens=2,
                                   batch_size_schedule=((2, 8, 2),)))
    assert ("speculative.batchSizeSchedule[0]", "the first range must start at batch 1") in found


# ---------------------------------------------------------------------------------------------
# reserved extraArgs: what our check refuses is what vLLM's parser takes for the flag (issue 36)

# a value per reserved flag, unlike its default, and what the parsed value then shows
PROBE_VALUES = {
    "--model": ("probe/model", r"probe/model"),
    "--port": ("9123", r"^9123$"),
    "--tensor-parallel-size": ("3", r"^3$"),
    "--max-model-len": ("1234", r"^1234$"),
    "--reasoning-parser": ("qwen3", r"qwen3"),
    "--served-model-name": ("probe-name", r"probe-name"),
    "--speculative-config": ('{"method":"mtp","num_speculative_tokens":3}',
                             r'"num_speculative_tokens": "?3'),
    "--spec-method": ("mtp", r"mtp"),
    "--spec-tokens": ("3", r"^3$"),
    "--pipeline-parallel-size": ("3", r"^3$"),
    "--data-parallel-size": ("3", r"^3$"),
    "--config": (None, None),  # a file: see spelling_cases
}
PROBE_CONFIG_PORT = 9124  # what the probe's --config file sets: a reserved flag


def spelling_cases(config_file: str) -> list[dict[str, object]]:
    """Every spelling our check refuses that can carry a value: `--flag v`, `--flag=v`,
    underscores, every abbreviation down to one letter, dotted keys, the short forms."""
    dsv3 = str(TINY / "dsv3-tiny")
    long_of = {"-tp": "--tensor-parallel-size", "-sc": "--speculative-config",
               "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size"}
    assert set(PROBE_VALUES) | set(long_of) == set(RESERVED_FLAGS)
    cases: list[dict[str, object]] = []

    def add(flag: str, entries: list[str]) -> None:
        cases.append({"id": f"spell/{flag}/{' '.join(entries)}", "flag": flag,
                      "entry": entries[0], "argv": ["vllm", "serve", dsv3, *entries],
                      "engine": False, "parse_only": True})

    for flag in sorted(RESERVED_FLAGS):
        long = long_of.get(flag, flag)
        value = PROBE_VALUES[long][0] or config_file
        if flag != long:  # a short form
            add(long, [flag, value])
            add(long, [f"{flag}={value}"])
            continue
        add(flag, [flag, value])
        add(flag, [f"{flag}={value}"])
        if "-" in flag[2:]:
            add(flag, [flag[:2] + flag[2:].replace("-", "_"), value])
        for end in range(3, len(flag)):
            add(flag, [f"{flag[:end]}={value}"])
    add("--speculative-config", ["--speculative-config.num_speculative_tokens=3"])
    add("--speculative-config", ["-sc.num_speculative_tokens", "3"])
    return cases


@pytest.fixture(scope="session")
def vllm_spellings(vllm_python: str, tmp_path_factory) -> tuple[list[dict[str, object]], dict]:
    folder = tmp_path_factory.mktemp("spellings")
    config_file = folder / "probe.yaml"
    config_file.write_text(f"port: {PROBE_CONFIG_PORT}\n")
    cases = spelling_cases(str(config_file))
    dests = ["model", "model_tag", "config", "port", "tensor_parallel_size", "max_model_len",
             "reasoning_parser", "served_model_name", "speculative_config", "spec_method",
             "spec_tokens", "pipeline_parallel_size", "data_parallel_size"]
    # a model or served name that starts with `-` (refused by problems() and the CRD)
    injected = [{"id": "inject/model", "argv": ["vllm", "serve", "-pp=2", "--port", "8000"]},
                {"id": "inject/served-name", "argv": ["vllm", "serve", str(TINY / "dsv3-tiny"),
                                                      "--served-model-name", "-pp=2"]}]
    payload = {"cases": [{"id": c["id"], "argv": c["argv"], "engine": False,
                          "parse_only": True, "dests": dests} for c in cases + injected]}
    out = folder / "results.json"
    proc = subprocess.run([vllm_python, str(HERE / "vllm_driver.py"), str(out)],
                          input=json.dumps(payload), capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0 and out.exists(), proc.stderr[-5000:]
    doc = json.loads(out.read_text())
    assert doc["vllm_version"] == "0.33.0"
    doc["by_id"] = {r["id"]: r for r in doc["results"]}
    doc["config_file"] = str(config_file)
    return cases, doc


def test_reserved_flags_are_vllm_flags_and_config_reads_a_file(vllm_spellings) -> None:
    """Each reserved flag, `--config` included, is a real option of vLLM's serve parser, and
    every other spelling vLLM has for the same setting (a short form) is refused too."""
    _, doc = vllm_spellings
    options = doc["serve_options"]
    for flag in RESERVED_FLAGS:
        assert flag in options, f"{flag} is not a vLLM 0.33 serve option"
    reserved_dests = {options[f] for f in RESERVED_FLAGS}
    for option, dest in options.items():
        if dest in reserved_dests:
            assert reserved_flags_in(option), f"{option} sets {dest} and is not refused"
    # `--config FILE` loads the file's flags: here a reserved one, the port
    result = doc["by_id"][f"spell/--config/--config {doc['config_file']}"]
    assert result["ok"], result
    assert result["values"]["port"] == PROBE_CONFIG_PORT


def test_every_refused_spelling_is_that_flag_to_vllm(vllm_spellings) -> None:
    """What our check (and the CRD's CEL rule, generated from the same pattern) refuses is what
    vLLM parses as the reserved flag, or an abbreviation vLLM refuses itself as ambiguous."""
    cases, doc = vllm_spellings
    options = doc["serve_options"]
    pattern = re.compile(reserved_pattern())
    for case in cases:
        flag, entry = str(case["flag"]), str(case["entry"])
        assert reserved_flags_in(entry) and pattern.search(entry), entry  # we refuse it
        result = doc["by_id"][case["id"]]
        abbreviation = "=" in entry and entry.split("=", 1)[0] not in options and \
            entry.split("=", 1)[0].replace("_", "-") not in options
        if not result["ok"]:
            assert abbreviation and "ambiguous" in (result["error"] or ""), result
            continue
        values = result["values"]
        if flag == "--config":
            assert values["config"] == doc["config_file"] or \
                values["port"] == PROBE_CONFIG_PORT, result
            continue
        shown = json.dumps(values[options[flag]])
        if flag == "--model" and values["model_tag"] == "probe/model":
            shown = "probe/model"
        assert re.search(PROBE_VALUES[flag][1], shown), (case["id"], values)


def test_a_model_that_starts_with_a_dash_is_a_flag_to_vllm(vllm_spellings) -> None:
    """Why model and servedModelName must not start with `-`: vLLM parses `-pp=2` in the
    model's place as pipeline parallelism (and as a served name, as no name at all)."""
    _, doc = vllm_spellings
    model = doc["by_id"]["inject/model"]
    assert model["ok"] and model["values"]["pipeline_parallel_size"] == 2, model
    served = doc["by_id"]["inject/served-name"]
    assert not served["ok"] or served["values"]["served_model_name"] != ["-pp=2"], served
    for field, settings in (
        ("model", ServeSettings(model="-pp=2", num_speculative_tokens=2)),
        ("servedModelName", ServeSettings(model="m", num_speculative_tokens=2,
                                          served_model_name="-pp=2")),
    ):
        assert field in [p.field for p in problems(settings)]
