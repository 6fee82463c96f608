"""Bad input around the real engine: `mtp-runtime serve` exits non-zero with one clear line
naming what failed (plus vLLM's last log lines when vLLM itself died), and the pool's readiness
(vLLM's /health on the serve port, the pod's readinessProbe) never turns True.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest

from support.engine import START_TIMEOUT, RealEngine, http_get


def run_to_exit(eng: RealEngine, timeout: float = START_TIMEOUT) -> tuple[int, list[str], bool]:
    """Start the runtime, probe readiness until it exits; (exit status, its plain
    `mtp-runtime:` lines, whether /health ever answered 200)."""
    eng.start(wait=False)
    assert eng.proc is not None
    ever_ready = False
    deadline = time.monotonic() + timeout
    try:
        while eng.proc.poll() is None and time.monotonic() < deadline:
            try:
                ever_ready |= http_get(f"{eng.url}/health", timeout=1)[0] == 200
            except OSError:
                pass
            time.sleep(0.3)
        assert eng.proc.poll() is not None, "the runtime did not exit"
    finally:
        rc = eng.stop()
    lines = [line for line in eng.log_text().splitlines() if line.startswith("mtp-runtime: ")]
    return rc, lines, ever_ready


def events(eng: RealEngine) -> list[str]:
    return [json.loads(line)["event"] for line in eng.log_text().splitlines()
            if line.startswith('{"ts"')]


def model_copy(src: Path, dst: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """A model folder of links to the tiny model's files, without `leave_out`."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in leave_out:
            (dst / f.name).symlink_to(f)
    return dst


def test_missing_engine_install(tiny_model_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-venv" / "mtp-bin" / "vllm"
    eng = RealEngine(missing, tiny_model_dir, k=1, exporter_port=None)
    rc, lines, ever_ready = run_to_exit(eng, timeout=60)
    assert rc == 127
    assert len(lines) == 1 and lines[0].startswith(f"mtp-runtime: cannot run '{missing}': "
                                                   "No such file or directory"), lines
    assert not ever_ready


def test_broken_engine_install(vllm_executable: Path, tiny_model_dir: Path,
                               tmp_path: Path) -> None:
    """The engine's wrapper, but its python has no vllm (a venv that lost its packages)."""
    broken = tmp_path / "vllm"
    text = vllm_executable.read_text()
    py_line = next(line for line in text.splitlines() if line.startswith("PY="))
    broken.write_text(text.replace(py_line, f'PY="{sys.executable}"'))
    broken.chmod(0o755)
    eng = RealEngine(broken, tiny_model_dir, k=1, exporter_port=None)
    rc, lines, ever_ready = run_to_exit(eng, timeout=120)
    assert rc == 1
    assert lines[0].startswith(f"mtp-runtime: vLLM exited with status 1 during start-up, "
                               f"before /health answered on port {eng.port}: "), lines
    assert "No module named 'vllm'" in lines[0], lines[0]
    assert lines[1].startswith("mtp-runtime: last ") and "lines of vLLM's log" in lines[1]
    assert "No module named 'vllm'" in eng.log_tail(5)
    assert not ever_ready and "vllm_ready" not in events(eng)


@pytest.mark.parametrize(("leave_out", "what"), [
    (("model.safetensors",), "has no weights"),
    (("tokenizer.json", "tokenizer_config.json"), "has no tokenizer"),
])
def test_model_folder_without_weights_or_tokenizer(vllm_executable: Path, tiny_model_dir: Path,
                                                   tmp_path: Path, leave_out, what) -> None:
    model = model_copy(tiny_model_dir, tmp_path / "model", leave_out)
    eng = RealEngine(vllm_executable, model, k=1, exporter_port=None)
    rc, lines, ever_ready = run_to_exit(eng, timeout=60)
    assert rc == 2
    assert len(lines) == 1 and lines[0].startswith(
        f"mtp-runtime: cannot start vLLM: model folder {model} {what}"), lines
    assert not ever_ready and "launch" not in events(eng)


def test_engine_dying_at_start_up(vllm_executable: Path, tiny_model_dir: Path,
                                  tmp_path: Path) -> None:
    """A model folder vLLM itself rejects (an architecture it does not know): the real engine
    dies while starting; the runtime says so in one line and shows vLLM's last lines."""
    model = model_copy(tiny_model_dir, tmp_path / "model", ("config.json",))
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForCausalLM"]
    (model / "config.json").write_text(json.dumps(cfg))
    eng = RealEngine(vllm_executable, model, k=1, exporter_port=None)
    rc, lines, ever_ready = run_to_exit(eng)
    assert rc != 0
    assert lines[0].startswith(f"mtp-runtime: vLLM exited with status {rc} during start-up, "
                               f"before /health answered on port {eng.port}: "), lines
    assert "NoSuchModelForCausalLM" in lines[0], lines[0]
    assert lines[1].startswith("mtp-runtime: last ")
    assert not ever_ready and "vllm_ready" not in events(eng)


def test_port_already_taken(vllm_executable: Path, tiny_model_dir: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        eng = RealEngine(vllm_executable, tiny_model_dir, k=1, port=port, exporter_port=None)
        rc, lines, ever_ready = run_to_exit(eng, timeout=60)
    assert rc == 4
    assert lines == [f"mtp-runtime: cannot start vLLM: port {port} on 127.0.0.1 is already "
                     "in use"], lines
    assert not ever_ready
