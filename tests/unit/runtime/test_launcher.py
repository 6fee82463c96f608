"""`mtp-runtime serve` runs vLLM as a child: signals reach it, its exit status becomes ours.

A fake `vllm` script on PATH stands in for vLLM; these tests start real processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mtp_runtime import exposition
from mtp_runtime.launcher import child_environment, exit_status
from mtp_runtime.pool_config import PoolConfig
from mtp_runtime.vllm_command import ServeSettings

pytestmark = pytest.mark.unit

FAKE_VLLM = r'''#!{python}
import json, os, signal, sys, time
out = os.environ["FAKE_VLLM_OUT"]
mode = os.environ.get("FAKE_VLLM_MODE", "wait")
with open(out + ".argv", "w") as f:
    json.dump({{"argv": sys.argv, "env": dict(os.environ)}}, f)

def on_signal(sig, frame):
    with open(out + ".signal", "w") as f:
        f.write(str(sig))
    sys.exit(int(os.environ.get("FAKE_VLLM_TERM_EXIT", "0")))

signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
if mode == "exit":
    sys.exit(int(os.environ["FAKE_VLLM_EXIT"]))
if mode == "crash":
    os.kill(os.getpid(), signal.SIGKILL)
fake = None
if mode == "serve":
    from support.fake_vllm import FakeVLLM
    port = int(sys.argv[sys.argv.index("--port") + 1])
    fake = FakeVLLM(k=6, model_name=sys.argv[2], port=port, seed=1).start()
open(out + ".ready", "w").close()
while True:
    time.sleep(0.05)
    if fake is not None:
        fake.advance_random(5, 0.9)
        fake.running = 1.0 if os.path.exists(out + ".busy") else 0.0
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def setup(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "vllm"
    script.write_text(FAKE_VLLM.format(python=sys.executable))
    script.chmod(0o755)
    port = free_port()
    config = PoolConfig(
        serve=ServeSettings(model="Qwen/Qwen3.6-27B", num_speculative_tokens=6,
                            method="qwen3_next_mtp", port=port, tensor_parallel_size=8,
                            reasoning_parser="qwen3", model_source="modelscope"),
        gpu_product="NVIDIA-H200",
    )
    cfg = tmp_path / "pool.json"
    cfg.write_text(config.to_json())
    env = dict(os.environ)
    env["PATH"] = str(bin_dir) + os.pathsep + env.get("PATH", "")
    env["FAKE_VLLM_OUT"] = str(tmp_path / "vllm")
    env["VLLM_PORT"] = "tcp://10.0.0.1:8000"  # what a Service named vllm would inject
    env.pop("MTP_RUNTIME_CONFIG", None)
    env["MTP_RUNTIME_STATE_DIR"] = str(tmp_path / "state")
    env["MTP_RUNTIME_DRAIN_SETTLE_SECONDS"] = "0.2"
    return tmp_path, cfg, env, port


def start_runtime(cfg: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "mtp_runtime.cli", "serve", "--config", str(cfg),
           "--assume-gpu", "NVIDIA-H200", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def kill_fake_vllm(tmp: Path) -> None:
    """A failed test kills the runtime; its fake vLLM child would run on: end it too."""
    needle = str(tmp / "bin" / "vllm").encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"runtime exited early: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} never appeared: {proc.communicate()}")
        time.sleep(0.02)


def log_events(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_is_forwarded_and_exit_code_propagated(setup, sig: signal.Signals) -> None:
    tmp, cfg, env, _ = setup
    env["FAKE_VLLM_TERM_EXIT"] = "7"
    proc = start_runtime(cfg, env, "--no-exporter")
    wait_for(tmp / "vllm.ready", proc)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=20)
    assert (tmp / "vllm.signal").read_text() == str(int(sig))
    assert proc.returncode == 7
    events = log_events(stderr)
    launch = next(e for e in events if e["event"] == "launch")
    seen = json.loads((tmp / "vllm.argv").read_text())
    assert seen["argv"][1:] == launch["argv"][1:]
    assert seen["env"]["VLLM_USE_MODELSCOPE"] == "true"
    assert "VLLM_PORT" not in seen["env"]  # the Service-injected value is dropped
    assert any(e["event"] == "env_dropped" for e in events)
    assert any(e["event"] == "vllm_exited" and e["exit_status"] == 7 for e in events)


def test_exit_code_propagated(setup) -> None:
    _, cfg, env, _ = setup
    env["FAKE_VLLM_MODE"] = "exit"
    env["FAKE_VLLM_EXIT"] = "3"
    proc = start_runtime(cfg, env, "--no-exporter")
    proc.communicate(timeout=20)
    assert proc.returncode == 3


def test_crash_is_not_hidden(setup) -> None:
    _, cfg, env, _ = setup
    env["FAKE_VLLM_MODE"] = "crash"
    proc = start_runtime(cfg, env, "--no-exporter")
    _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 128 + signal.SIGKILL
    assert any(e["event"] == "vllm_exited" and e["level"] == "error"
               for e in log_events(stderr))


def test_vllm_not_found(setup, tmp_path: Path) -> None:
    _, cfg, env, _ = setup
    env["PATH"] = str(tmp_path / "empty")
    proc = subprocess.run([sys.executable, "-m", "mtp_runtime.cli", "serve", "--config",
                           str(cfg), "--assume-gpu", "NVIDIA-H200", "--no-exporter"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 127
    assert "vllm_not_found" in proc.stderr


def test_serve_with_exporter_end_to_end(setup) -> None:
    tmp, cfg, env, _ = setup
    env["FAKE_VLLM_MODE"] = "serve"
    exporter_port = free_port()
    proc = start_runtime(cfg, env, "--exporter-port", str(exporter_port),
                         "--exporter-host", "127.0.0.1", "--scrape-interval", "0.1",
                         "--window", "60")
    try:
        wait_for(tmp / "vllm.ready", proc)
        deadline = time.monotonic() + 20
        values: dict[str, float] = {}
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(
                    f"http://127.0.0.1:{exporter_port}/metrics", timeout=2).read().decode()
                values = {s.name: s.value for s in exposition.parse_exposition(body).samples
                          if not s.labels}
                if "mtp_hit_rate" in values:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert values.get("mtp_runtime_vllm_up") == 1.0
        assert values["mtp_num_speculative_tokens"] == 6.0
        assert values["mtp_observed_num_speculative_tokens"] == 6.0
        assert 0.8 < values["mtp_hit_rate"] <= 1.0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert proc.returncode == 0


def test_helpers() -> None:
    assert exit_status(0) == 0
    assert exit_status(1) == 1
    assert exit_status(-signal.SIGTERM) == 143
    keep = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "75"}
    env, dropped = child_environment({"VLLM_PORT": "8001", "A": "1"}, {"B": "2"})
    assert env == {"VLLM_PORT": "8001", "A": "1", "B": "2", **keep} and dropped == []
    env, dropped = child_environment({"VLLM_PORT": "tcp://1.2.3.4:80"}, {})
    assert env == keep and dropped == ["VLLM_PORT"]
    # the pod's own keep-alive wins
    env, _ = child_environment({"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "5"}, {})
    assert env == {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "5"}


def http_get(url: str) -> tuple[int | None, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None, ""


def poll(fn, what: str, proc: subprocess.Popen[str], timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"runtime exited before {what}: {proc.communicate()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"never {what}: {proc.communicate()}")


def test_sigterm_drains_before_vllm_is_stopped(setup) -> None:
    """SIGTERM: /ready turns 503 at once, vLLM keeps running while it reports a running
    request, and gets SIGTERM (with --shutdown-timeout on its command line) once idle."""
    tmp, cfg, env, port = setup
    env["FAKE_VLLM_MODE"] = "serve"
    exporter_port = free_port()
    ready_url = f"http://127.0.0.1:{exporter_port}/ready"
    proc = start_runtime(cfg, env, "--exporter-port", str(exporter_port),
                         "--exporter-host", "127.0.0.1")
    try:
        wait_for(tmp / "vllm.ready", proc)
        assert poll(lambda: http_get(ready_url)[0] == 200, "Ready", proc)
        (tmp / "vllm.busy").touch()  # the fake reports one running request
        metrics = f"http://127.0.0.1:{port}/metrics"
        assert poll(lambda: "vllm:num_requests_running{" in http_get(metrics)[1] and any(
            line.startswith("vllm:num_requests_running{") and line.endswith(" 1.0")
            for line in http_get(metrics)[1].splitlines()), "busy", proc)
        proc.send_signal(signal.SIGTERM)
        assert poll(lambda: http_get(ready_url) == (503, "draining\n"), "draining", proc)
        marker = tmp / "state" / "draining"
        assert poll(marker.exists, "marked draining", proc)  # by the drain's thread
        # still busy: the drain cannot have ended (its timeout is 120 s), vLLM not signalled
        assert not (tmp / "vllm.signal").exists() and proc.poll() is None
        (tmp / "vllm.busy").unlink()
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_fake_vllm(tmp)
    assert proc.returncode == 0
    assert (tmp / "vllm.signal").read_text() == str(int(signal.SIGTERM))
    events = log_events(stderr)
    done = next(e for e in events if e["event"] == "drain_done")
    assert done["reason"] == "idle" and done["by"] == "sigterm"
    names = [e["event"] for e in events]
    assert names.index("drain_begun") < names.index("drain_done") < names.index(
        "signal_forwarded")
    argv = json.loads((tmp / "vllm.argv").read_text())["argv"]
    assert argv[argv.index("--shutdown-timeout") + 1] == "10"


def test_drain_command_is_the_prestop(setup) -> None:
    """`mtp-runtime drain` (another process, as the preStop is) makes serve's /ready 503 and
    returns once vLLM is idle; the SIGTERM after it continues the same drain."""
    tmp, cfg, env, _ = setup
    env["FAKE_VLLM_MODE"] = "serve"
    exporter_port = free_port()
    ready_url = f"http://127.0.0.1:{exporter_port}/ready"
    proc = start_runtime(cfg, env, "--exporter-port", str(exporter_port),
                         "--exporter-host", "127.0.0.1")
    try:
        wait_for(tmp / "vllm.ready", proc)
        assert poll(lambda: http_get(ready_url)[0] == 200, "Ready", proc)
        drained = subprocess.run(
            [sys.executable, "-m", "mtp_runtime.cli", "drain", "--config", str(cfg)],
            env=env, capture_output=True, text=True, timeout=60)
        assert drained.returncode == 0, drained.stderr
        done = [e for e in log_events(drained.stderr) if e["event"] == "drain_done"]
        assert [(e["reason"], e["by"]) for e in done] == [("idle", "drain")]
        assert http_get(ready_url) == (503, "draining\n")
        assert proc.poll() is None and not (tmp / "vllm.signal").exists()
        started = float((tmp / "state" / "draining").read_text())
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_fake_vllm(tmp)
    assert proc.returncode == 0
    begun = next(e for e in log_events(stderr) if e["event"] == "drain_begun")
    assert begun["started_at"] == round(started, 3)  # the preStop's drain, continued
