"""mtp_runtime.engine: machine-specific engine flags from the environment (never in the
operator's command line), checks before the launch, and the start-up failure report.

The real engine's own start-up failures are exercised in tests/engine/test_bad_input.py; here a
small script stands in for vLLM so that every path runs in well under a second.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mtp_operator.render import render_resource
from mtp_operator.settings import OperatorSettings
from mtp_runtime import engine
from mtp_runtime.gpu_detect import assumed
from mtp_runtime.launcher import plan
from mtp_runtime.pool_config import PoolConfig
from mtp_runtime.vllm_command import ServeSettings

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


# -- additions from the environment -------------------------------------------------------------

def test_no_additions_by_default() -> None:
    assert engine.engine_additions({}) == ([], {})
    assert engine.engine_additions({"MTP_RUNTIME_DEVICE": "gpu"}) == ([], {})


def test_cpu_device_adds_the_cpu_flags_and_env() -> None:
    args, env = engine.engine_additions({"MTP_RUNTIME_DEVICE": "CPU"})
    assert args == ["--kv-cache-memory-bytes", str(256 * 2**20), "--enforce-eager"]
    assert env == {"VLLM_TARGET_DEVICE": "cpu"}


def test_engine_args_are_appended_last_so_they_win() -> None:
    args, _ = engine.engine_additions({"MTP_RUNTIME_DEVICE": "cpu",
                                       "MTP_RUNTIME_ENGINE_ARGS":
                                       "--host 127.64.0.9 --gpu-memory-utilization=0.03"})
    assert args[-3:] == ["--host", "127.64.0.9", "--gpu-memory-utilization=0.03"]
    assert engine.flag_value(args, "--gpu-memory-utilization") == "0.03"
    assert engine.flag_value(args, "--host") == "127.64.0.9"


@pytest.mark.parametrize("arg", ["--port 9000", "--speculative-config={}",
                                 "--speculative_config {}", "-tp 2", "--max-model-len 4k"])
def test_engine_args_cannot_override_the_pool_settings(arg: str) -> None:
    with pytest.raises(engine.EngineSetupError, match="MTP_RUNTIME_ENGINE_ARGS") as exc:
        engine.engine_additions({"MTP_RUNTIME_ENGINE_ARGS": arg})
    assert arg.split()[0].split("=")[0] in str(exc.value)


def test_bad_device_and_unsplittable_args_are_named() -> None:
    with pytest.raises(engine.EngineSetupError, match="MTP_RUNTIME_DEVICE='tpu'"):
        engine.engine_additions({"MTP_RUNTIME_DEVICE": "tpu"})
    with pytest.raises(engine.EngineSetupError, match="cannot split"):
        engine.engine_additions({"MTP_RUNTIME_ENGINE_ARGS": "--host 'unclosed"})


def test_the_pure_plan_ignores_the_engine_environment(monkeypatch) -> None:
    cfg = PoolConfig(serve=ServeSettings(model="org/m", num_speculative_tokens=2, port=8000),
                     gpu_product="NVIDIA-H200")
    before = plan(cfg, assumed("NVIDIA-H200")).argv
    monkeypatch.setenv("MTP_RUNTIME_DEVICE", "cpu")
    monkeypatch.setenv("MTP_RUNTIME_ENGINE_ARGS", "--host 1.2.3.4")
    assert plan(cfg, assumed("NVIDIA-H200")).argv == before
    assert "--enforce-eager" not in before


@pytest.mark.parametrize("product", ["NVIDIA-H200", "NVIDIA-L40S"])
def test_operator_render_is_the_golden_one_under_the_cpu_environment(monkeypatch,
                                                                      product: str) -> None:
    monkeypatch.setenv("MTP_RUNTIME_DEVICE", "cpu")
    monkeypatch.setenv("MTP_RUNTIME_ENGINE_ARGS", "--host 127.0.0.1")
    example = yaml.safe_load((REPO / "examples" / "qwen3.6-27b.yaml").read_text())
    settings = OperatorSettings(default_image="ghcr.io/mtp-operator/mtp-runtime:golden")
    objs = render_resource(example, [product], settings)
    golden = REPO / "tests" / "fixtures" / "golden" / "qwen3.6-27b" / f"{product}.yaml"
    assert objs == list(yaml.safe_load_all(golden.read_text()))


# -- checks before the launch -------------------------------------------------------------------

def _model(tmp_path: Path, *files: str) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    for f in files:
        (d / f).write_text("{}")
    return d


def test_model_folder_checks(tmp_path: Path) -> None:
    assert engine.model_problem("Qwen/Qwen3.6-27B") is None  # a hub name: not checked here
    assert "does not exist" in engine.model_problem(str(tmp_path / "nope"))
    d = _model(tmp_path)
    assert engine.model_problem(str(d)) == f"model folder {d} has no config.json"
    (d / "config.json").write_text("{}")
    assert "has no weights" in engine.model_problem(str(d))
    assert engine.model_problem(str(d), ["--load-format", "dummy"]) is not None  # tokenizer
    (d / "model.safetensors").write_text("")
    assert "has no tokenizer" in engine.model_problem(str(d))
    assert engine.model_problem(str(d), ["--tokenizer", "org/tok"]) is None
    (d / "tokenizer.json").write_text("{}")
    assert engine.model_problem(str(d)) is None


def _as_other_user(fn) -> str | None:
    """fn() in a forked child that runs as an unprivileged user (as root, which may read any
    file, the check could never fail) or as this user where it is not root."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            os.write(write, json.dumps(fn()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return json.loads(out)


def test_model_files_this_user_cannot_read_are_found(tmp_path: Path) -> None:
    import tempfile

    # a folder any user can reach (pytest's tmp_path sits under a root-only folder)
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        os.chmod(top, 0o755)
        d = _model(Path(top), "config.json", "tokenizer.json", "model.safetensors")
        for f in d.iterdir():
            f.chmod(0o644)
        os.chmod(d, 0o755)
        assert _as_other_user(lambda: engine.model_problem(str(d))) is None
        # owner only, as safetensors writes it (root's file; a non-root runner owns the file,
        # so there no one may read it)
        mode = 0o600 if os.geteuid() == 0 else 0o000
        (d / "model.safetensors").chmod(mode)
        problem = _as_other_user(lambda: engine.model_problem(str(d)))
        assert problem is not None and "model.safetensors" in problem, problem
        assert "not readable by this process" in problem and f"mode {mode:04o}" in problem
        os.chmod(d, 0o700)
        problem = _as_other_user(lambda: engine.model_problem(str(d)))
        assert problem is not None and "cannot be listed" in problem, problem


def test_port_in_use_is_found(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert engine.port_problem("127.0.0.1", port) == \
            f"port {port} on 127.0.0.1 is already in use"
        with pytest.raises(engine.EngineSetupError) as exc:
            engine.preflight("org/m", port, ["--host", "127.0.0.1"])
        assert exc.value.what == "port"
    assert engine.port_problem("127.0.0.1", port) is None


def test_log_tail_reason_is_the_last_error_line() -> None:
    tail = engine.LogTail(size=5)
    tail.lines.extend(["INFO loading", "Traceback (most recent call last):",
                       '  File "x.py", line 1', "ValueError: Head size 96 is not supported",
                       ""])
    assert tail.reason() == "ValueError: Head size 96 is not supported"
    assert tail.last(2) == ['  File "x.py", line 1', "ValueError: Head size 96 is not supported"]


# -- the runtime reports an engine that dies during start-up -------------------------------------

DYING = """#!{python}
import sys
print("INFO 12-01 starting the engine", flush=True)
print("RuntimeError: Engine core initialization failed. See root cause above.", file=sys.stderr)
sys.exit(3)
"""


def test_engine_dying_at_start_up_gives_one_line_and_its_log(tmp_path: Path) -> None:
    script = tmp_path / "vllm"
    script.write_text(DYING.format(python=sys.executable))
    script.chmod(0o755)
    cfg = PoolConfig(serve=ServeSettings(model="org/m", num_speculative_tokens=1, port=0),
                     gpu_product="NVIDIA-H200")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = json.loads(cfg.to_json())
    data["serve"]["port"] = port
    (tmp_path / "pool.json").write_text(json.dumps(data))
    env = {**os.environ, "MTP_RUNTIME_VLLM": str(script), "MTP_RUNTIME_DEVICE": "cpu",
           "MTP_RUNTIME_ENGINE_ARGS": "--host 127.0.0.1"}
    p = subprocess.run([sys.executable, "-m", "mtp_runtime.cli", "serve", "--config",
                        str(tmp_path / "pool.json"), "--no-exporter"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 3
    plain = [line for line in p.stderr.splitlines() if line.startswith("mtp-runtime: ")]
    assert plain[0] == (f"mtp-runtime: vLLM exited with status 3 during start-up, before "
                        f"/health answered on port {port}: RuntimeError: Engine core "
                        "initialization failed. See root cause above.")
    assert "  | INFO 12-01 starting the engine" in p.stderr
    events = [json.loads(line)["event"] for line in p.stderr.splitlines()
              if line.startswith("{")]
    assert "vllm_startup_failed" in events
    assert "vllm_ready" not in events
    launch = next(json.loads(line) for line in p.stderr.splitlines()
                  if line.startswith("{") and '"launch"' in line)
    assert launch["argv"][0] == str(script)
    assert launch["argv"][-7:] == ["--kv-cache-memory-bytes", str(256 * 2**20),
                                   "--enforce-eager", "--host", "127.0.0.1",
                                   "--shutdown-timeout", "10"]  # vLLM's drain (issue 37)
    assert launch["env"]["VLLM_TARGET_DEVICE"] == "cpu"


def test_draft_attention_backend_is_added_to_the_speculative_config_only() -> None:
    argv = ["vllm", "serve", "m", "--speculative-config",
            '{"method":"mtp","num_speculative_tokens":4}', "--seed", "0"]
    out = engine.with_draft_attention_backend(
        argv, {engine.DRAFT_ATTENTION_ENV: "TRITON_ATTN"})
    assert json.loads(out[4]) == {"method": "mtp", "num_speculative_tokens": 4,
                                  "attention_backend": "TRITON_ATTN"}
    assert out[:4] + out[5:] == argv[:4] + argv[5:]
    assert engine.with_draft_attention_backend(argv, {}) == argv
    no_spec = ["vllm", "serve", "m", "--seed", "0"]
    assert engine.with_draft_attention_backend(
        no_spec, {engine.DRAFT_ATTENTION_ENV: "TRITON_ATTN"}) == no_spec
