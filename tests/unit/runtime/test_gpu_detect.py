"""GPU detection: parsing nvidia-smi/NVML output into GFD product strings."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from mtp_runtime import gpu_detect
from mtp_runtime.gpu_detect import GPUDetectionError, from_nvml_values, parse_nvidia_smi

pytestmark = pytest.mark.unit

H200_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "h200"


def test_h200_line_as_in_gpu_facts() -> None:
    gpu = parse_nvidia_smi("NVIDIA H200, 143771 MiB\n")
    assert gpu.product == "NVIDIA-H200"
    assert gpu.name == "NVIDIA H200"
    assert gpu.family == "H200"
    assert gpu.count == 1
    assert gpu.memory_mib == 143771
    assert gpu.source == "nvidia-smi"


def test_several_gpus_header_extra_columns_and_na() -> None:
    text = (
        "name, memory.total [MiB]\n"
        "NVIDIA H100 80GB HBM3, 81559 MiB, 1, 580.1\n"
        "NVIDIA H100 80GB HBM3, [N/A]\n\n"
    )
    gpu = parse_nvidia_smi(text)
    assert gpu.product == "NVIDIA-H100-80GB-HBM3"
    assert gpu.family == "H100"
    assert gpu.count == 2
    assert gpu.memory_mib == 81559
    assert gpu.products == ()
    assert parse_nvidia_smi("Tesla T4, [N/A]").memory_mib is None


def test_mixed_gpus_are_listed() -> None:
    gpu = parse_nvidia_smi("NVIDIA A100-SXM4-80GB, 81920 MiB\nNVIDIA L40S, 46068 MiB\n")
    assert gpu.product == "NVIDIA-A100-SXM4-80GB"
    assert gpu.products == ("NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S")


def test_nvidia_smi_errors() -> None:
    with pytest.raises(GPUDetectionError):
        parse_nvidia_smi("")
    with pytest.raises(GPUDetectionError, match="NVIDIA-SMI has failed"):
        parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the "
                         "NVIDIA driver.\n")
    with pytest.raises(GPUDetectionError, match="No devices"):
        parse_nvidia_smi("No devices were found\n")


def test_nvml_names_str_or_bytes() -> None:
    # values as gpu-facts.md recorded them on the H200
    gpu = from_nvml_values(["NVIDIA H200"], [150754820096])
    assert gpu.product == "NVIDIA-H200"
    assert gpu.memory_mib == 143771
    assert gpu.source == "nvml"
    old = from_nvml_values([b"NVIDIA A100-SXM4-40GB", b"NVIDIA A100-SXM4-40GB"], [None, None])
    assert old.product == "NVIDIA-A100-SXM4-40GB"
    assert old.count == 2
    assert old.memory_mib is None


def test_detect_without_gpu_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_nvml() -> gpu_detect.GPUInfo:
        raise GPUDetectionError("NVML could not start: driver not loaded")

    monkeypatch.setattr(gpu_detect, "detect_nvml", no_nvml)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    with pytest.raises(GPUDetectionError) as err:
        gpu_detect.detect()
    msg = str(err.value)
    assert "no NVIDIA GPU detected" in msg
    assert "driver not loaded" in msg
    assert "nvidia-smi not found" in msg
    assert "--cpu-dry-run" in msg


def _fake_nvidia_smi(tmp_path: Path, output: str, code: int = 0) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport sys\nprint({output!r}, end='')\n"
                      f"sys.exit({code})\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_falls_back_to_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gpu_detect, "detect_nvml",
                        lambda: (_ for _ in ()).throw(GPUDetectionError("no pynvml")))
    _fake_nvidia_smi(tmp_path, "NVIDIA L40S, 46068 MiB\n")
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    gpu = gpu_detect.detect()
    assert (gpu.product, gpu.source, gpu.memory_mib) == ("NVIDIA-L40S", "nvidia-smi", 46068)


def test_nvidia_smi_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_nvidia_smi(tmp_path, "NVIDIA-SMI has failed because no driver\n", code=9)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GPUDetectionError, match="exited 9"):
        gpu_detect.detect_nvidia_smi()


def test_assumed_gpu_for_cpu_dry_runs() -> None:
    gpu = gpu_detect.assumed("NVIDIA H100 80GB HBM3")
    assert gpu.product == "NVIDIA-H100-80GB-HBM3"
    assert gpu.source == "config"
    assert gpu.to_dict()["family"] == "H100"


@pytest.mark.skipif(not (H200_FIXTURES / "nvidia-smi.csv").exists(),
                    reason="no recorded H200 output in tests/fixtures/h200")
def test_recorded_h200_nvidia_smi() -> None:
    gpu = parse_nvidia_smi((H200_FIXTURES / "nvidia-smi.csv").read_text())
    assert gpu.product == "NVIDIA-H200"
    assert gpu.family == "H200"
    detected = json.loads((H200_FIXTURES / "detect.json").read_text())
    assert detected["product"] == "NVIDIA-H200"
    assert detected["memory_mib"] == gpu.memory_mib
