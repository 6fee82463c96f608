"""`mtp-runtime` CLI: print-args, stats, detect, config errors; recorded H200 output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mtp_runtime import cli
from mtp_runtime.gpu_detect import GPUInfo
from mtp_runtime.launcher import plan
from mtp_runtime.pool_config import ENV_VAR, PoolConfig
from mtp_runtime.vllm_command import ServeSettings

pytestmark = pytest.mark.unit

H200 = Path(__file__).resolve().parents[2] / "fixtures" / "h200"
SEED = ServeSettings(model="Qwen/Qwen3.6-27B", num_speculative_tokens=2, method="qwen3_next_mtp",
                     port=8000, tensor_parallel_size=8, max_model_len="262144",
                     reasoning_parser="qwen3", model_source="modelscope")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_print_args_cpu_dry_run_from_env(capsys, monkeypatch) -> None:
    config = PoolConfig(serve=SEED, gpu_product="NVIDIA-H100-80GB-HBM3", k_mode="fixed")
    monkeypatch.setenv(ENV_VAR, config.to_json())
    code, out, _ = run_cli(capsys, "print-args", "--cpu-dry-run")
    assert code == 0
    doc = json.loads(out)
    assert list(doc) == ["argv", "env", "gpu", "k"]
    assert doc["argv"] == [
        "vllm", "serve", "Qwen/Qwen3.6-27B", "--port", "8000", "--tensor-parallel-size", "8",
        "--max-model-len", "262144", "--reasoning-parser", "qwen3", "--speculative-config",
        '{"method":"qwen3_next_mtp","num_speculative_tokens":2}',
    ]
    assert doc["env"] == {"VLLM_USE_MODELSCOPE": "true"}
    assert doc["gpu"]["source"] == "config" and doc["gpu"]["mismatch"] is False
    assert doc["k"]["k"] == 2
    # serve --dry-run prints the same
    code, out2, _ = run_cli(capsys, "serve", "--cpu-dry-run")
    assert code == 0 and json.loads(out2) == doc


def test_mismatch_re_resolves_k_and_warns(capsys, tmp_path) -> None:
    cfg = tmp_path / "pool.json"
    cfg.write_text(PoolConfig(serve=SEED, gpu_product="NVIDIA-L40S").to_json())
    code, out, err = run_cli(capsys, "print-args", "--config", str(cfg),
                             "--assume-gpu", "NVIDIA-A100-SXM4-80GB")
    assert code == 0
    doc = json.loads(out)
    assert doc["k"] == {
        "k": 4, "source": "profile", "mode": "auto", "operator_k": 2, "re_resolved": True,
        "reason": "GPU profile for A100 (re-resolved: the pool was planned for NVIDIA-L40S, "
                  "the pod got NVIDIA-A100-SXM4-80GB)",
    }
    assert doc["gpu"]["mismatch"] is True
    warning = json.loads(err.splitlines()[0])
    assert warning["event"] == "gpu_mismatch" and warning["level"] == "warning"
    assert warning["expected"] == "NVIDIA-L40S"
    assert warning["detected"] == "NVIDIA-A100-SXM4-80GB"


def test_mig_slice_is_not_a_mismatch(capsys, tmp_path) -> None:
    cfg = tmp_path / "pool.json"
    config = PoolConfig(serve=SEED, gpu_product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
                        profiles={"NVIDIA-A100-SXM4-40GB-MIG-1g.5gb": 1})
    cfg.write_text(config.to_json())
    code, out, err = run_cli(capsys, "print-args", "--config", str(cfg),
                             "--assume-gpu", "NVIDIA A100-SXM4-40GB")
    assert code == 0 and err == ""
    assert json.loads(out)["k"]["k"] == 2  # the operator's K for the slice is kept


def test_config_errors(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    code, _, err = run_cli(capsys, "print-args", "--cpu-dry-run")
    assert code == cli.EXIT_CONFIG and ENV_VAR in err
    monkeypatch.setenv(ENV_VAR, "{not json")
    code, _, err = run_cli(capsys, "print-args", "--cpu-dry-run")
    assert code == cli.EXIT_CONFIG and "invalid pool configuration" in err
    bad = PoolConfig(serve=ServeSettings(model="m", num_speculative_tokens=3, mtp_layers=2),
                     gpu_product="NVIDIA-H200", k_mode="fixed")
    monkeypatch.setenv(ENV_VAR, bad.to_json())
    code, _, err = run_cli(capsys, "print-args", "--cpu-dry-run")
    assert code == cli.EXIT_CONFIG
    assert "3 is not valid for mtpLayers=2" in err


def test_no_gpu_is_a_clear_error(capsys, monkeypatch) -> None:
    from mtp_runtime import gpu_detect

    def none() -> GPUInfo:
        raise gpu_detect.GPUDetectionError("no NVIDIA GPU detected (test)")

    monkeypatch.setattr(gpu_detect, "detect", none)
    monkeypatch.setenv(ENV_VAR, PoolConfig(serve=SEED, gpu_product="NVIDIA-H200").to_json())
    code, _, err = run_cli(capsys, "print-args")
    assert code == cli.EXIT_NO_GPU and "no NVIDIA GPU detected" in err
    code, _, err = run_cli(capsys, "detect")
    assert code == cli.EXIT_NO_GPU


def test_stats_prints_exactly_the_keys(capsys, sample_prom, tmp_path) -> None:
    f = tmp_path / "m.prom"
    f.write_text(sample_prom)
    code, out, _ = run_cli(capsys, "stats", str(f))
    assert code == 0
    doc = json.loads(out)
    assert doc == pytest.approx({
        "hit_rate": 2 / 3, "acceptance_rate": 0.5, "mean_acceptance_length": 3.0,
        "avg_k_used": 2.0, "error_propagation_rate": 1 / 3, "num_speculative_tokens": 4})
    assert list(doc) == ["hit_rate", "acceptance_rate", "mean_acceptance_length", "avg_k_used",
                         "error_propagation_rate", "num_speculative_tokens"]


def test_stats_from_url_and_no_data(capsys, fake_vllm) -> None:
    code, out, _ = run_cli(capsys, "stats", fake_vllm.metrics_url)
    assert code == 0
    assert json.loads(out) == dict.fromkeys(
        ["hit_rate", "acceptance_rate", "mean_acceptance_length", "avg_k_used",
         "error_propagation_rate", "num_speculative_tokens"])
    fake_vllm.advance([4, 2, 0])
    code, out, _ = run_cli(capsys, "stats", fake_vllm.metrics_url)
    assert json.loads(out)["error_propagation_rate"] == pytest.approx(1 / 3)


def test_console_script_entry_point() -> None:
    proc = subprocess.run([sys.executable, "-m", "mtp_runtime.cli", "--version"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "mtp-runtime" in proc.stdout


def test_runtime_imports_stay_light() -> None:
    code = ("import sys, mtp_runtime.cli, mtp_runtime.exporter, mtp_runtime.figures; "
            "bad = [m for m in ('kopf', 'lightkube', 'pydantic', 'mtp_operator', 'yaml') "
            "if m in sys.modules]; print(bad)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30)
    assert proc.stdout.strip() == "[]", proc.stderr


@pytest.mark.parametrize("pool", ["h200", "h100", "l40s", "a100-fixed"])
def test_recorded_h200_print_args_still_match(pool: str) -> None:
    recorded = H200 / f"print-args-{pool}.json"
    config = PoolConfig.from_json((H200 / f"pool-{pool}.json").read_text())
    detected = json.loads((H200 / "detect.json").read_text())
    detected.pop("family")
    detected["products"] = tuple(detected["products"])
    gpu = GPUInfo(**detected)
    assert plan(config, gpu).to_dict() == json.loads(recorded.read_text())


def test_each_log_line_reaches_stderr_in_one_write(monkeypatch) -> None:
    # The pump threads copy vLLM's lines to the same stderr; under PYTHONUNBUFFERED a record
    # written as the text and then its newline could get a vLLM line in between.
    class Recorder:
        def __init__(self) -> None:
            self.writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    rec = Recorder()
    monkeypatch.setattr(cli.sys, "stderr", rec)
    cli.log("vllm_ready", after_s=35.1, port=42729)
    cli.log("vllm_exited", level="error", exit_status=1)
    assert len(rec.writes) == 2, rec.writes
    for text in rec.writes:
        assert text.endswith("\n") and text.count("\n") == 1
        json.loads(text)
