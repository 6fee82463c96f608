"""Pool starts with and without a model cache, on the real CPU engine and a hub stand-in.

One `pool_start()` is what one new pod of a pool does: `mtp-runtime serve` (the real runtime)
with the pool's configuration (the model as a hub id, K, and the cache volume or none), in a
fresh home folder (a new container's file system), with `HF_ENDPOINT` pointing at
`support.hub_standin.HubStandIn`. It waits for the runtime's `model_loaded` log line (vLLM's
/health answered), reads the runtime's exporter, stops the pod (SIGTERM) and returns what the
hub was asked meanwhile. Shared by tests/engine/test_model_cache.py and bench/cache/model_cache.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from support.hub_standin import HubStandIn, Request

REPO = Path(__file__).resolve().parents[2]
GPU_PRODUCT = "NVIDIA-H200"  # what the pool config claims; the engine runs on the CPU
HUB_ID = "mtp-test/tiny-mimo-mtp"
CACHE_MOUNT = "/model-cache"  # the path in a pod; a local folder stands for it here


@dataclass
class Start:
    label: str
    k: int
    cache: str  # "hostPath", "persistentVolumeClaim" or "none"
    ready_s: float  # wall time from the runtime's start to model_loaded
    load_s: float  # the runtime's own figure (vLLM's start to its first healthy /health)
    exported_load_s: float | None  # mtp_runtime_model_load_seconds as the exporter shows it
    origin: str
    downloaded_bytes: int
    offline: bool
    requests: list[Request]
    downloads: dict[str, int]
    bytes_served: int
    events: list[dict] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        return {
            "label": self.label, "k": self.k, "cache": self.cache,
            "ready_s": round(self.ready_s, 2), "load_s": round(self.load_s, 2),
            "exported_load_s": None if self.exported_load_s is None
            else round(self.exported_load_s, 2),
            "origin": self.origin, "offline": self.offline,
            "downloaded_bytes": self.downloaded_bytes,
            "hub_requests": len(self.requests),
            "hub_file_downloads": sum(self.downloads.values()),
            "hub_bytes_served": self.bytes_served,
        }


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pool_config(model: str, k: int, port: int, cache_dir: Path | None, kind: str,
                read_only: bool = False) -> dict:
    config: dict = {
        "serve": {"model": model, "num_speculative_tokens": k, "method": "mtp", "port": port,
                  "served_model_name": "tiny", "mtp_layers": 1, "extra_args": []},
        "gpu_product": GPU_PRODUCT,
        "k_mode": "fixed",
    }
    if cache_dir is not None:
        config["model_cache"] = {"path": str(cache_dir), "kind": kind, "read_only": read_only}
    return config


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def pool_start(
    vllm: Path,
    hub: HubStandIn,
    *,
    label: str,
    k: int,
    cache_dir: Path | None,
    kind: str = "hostPath",
    model: str = HUB_ID,
    read_only: bool = False,
    timeout: float = 900.0,
    workdir: Path | None = None,
) -> Start:
    workdir = Path(tempfile.mkdtemp(prefix=f"pod-{label}-", dir=workdir))
    # vLLM puts its ZeroMQ sockets in TMPDIR; their paths must stay under 108 characters
    tmp = Path(tempfile.mkdtemp(prefix="mtp-pod-", dir="/tmp"))
    home = workdir / "home"  # the new container's own file system
    home.mkdir()
    port, exporter_port = free_port(), free_port()
    config_path = workdir / "pool.json"
    config_path.write_text(json.dumps(pool_config(model, k, port, cache_dir, kind, read_only)))
    env = {k_: v for k_, v in os.environ.items()
           if not k_.startswith(("HF_", "HUGGINGFACE_", "MODELSCOPE_", "VLLM_", "MTP_"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), HF_ENDPOINT=hub.endpoint,
               HF_HUB_DISABLE_TELEMETRY="1", MTP_RUNTIME_VLLM=str(vllm),
               MTP_RUNTIME_DEVICE="cpu", PYTHONUNBUFFERED="1", TMPDIR=str(tmp))
    before = len(hub.snapshot())
    cmd = [sys.executable, "-m", "mtp_runtime.cli", "serve", "--config", str(config_path),
           "--exporter-host", "127.0.0.1",
           "--exporter-port", str(exporter_port), "--scrape-interval", "1"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    events: list[dict] = []
    loaded = threading.Event()
    log_lines: list[str] = []
    log_path = workdir.parent / f"{workdir.name}.log"  # kept: the pod's whole log

    def read() -> None:
        assert proc.stderr is not None
        with open(log_path, "w") as log_file:
            for line in proc.stderr:
                log_file.write(line)
                log_file.flush()
                log_lines.append(line.rstrip())
                if not line.startswith("{"):
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("logger") == "mtp-runtime":
                    events.append(event)
                    if event.get("event") == "model_loaded":
                        loaded.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while not loaded.wait(0.5):
            if proc.poll() is not None or time.monotonic() - t0 > timeout:
                tail = "\n".join(log_lines[-40:])
                raise RuntimeError(f"{label}: no model_loaded (exit {proc.poll()}; whole log "
                                   f"in {log_path}):\n{tail}")
        ready_s = time.monotonic() - t0
        exported = None
        for _ in range(20):  # the exporter shows the figure once the runtime has set it
            with urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics",
                                        timeout=5) as resp:
                exported = _metric(resp.read().decode(), "mtp_runtime_model_load_seconds")
            if exported is not None:
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        reader.join(timeout=5)
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    done = next(e for e in events if e["event"] == "model_loaded")
    requests = hub.snapshot()[before:]
    return Start(
        label=label, k=k, cache=kind if cache_dir is not None else "none", ready_s=ready_s,
        load_s=float(done["seconds"]), exported_load_s=exported, origin=done["origin"],
        downloaded_bytes=int(done["downloaded_bytes"]), offline=bool(done["offline"]),
        requests=requests, downloads=hub.downloads(before), bytes_served=hub.bytes_served(before),
        events=events,
    )


def model_files(folder: Path) -> dict[str, int]:
    """The files the hub stand-in serves for `folder` (what a full download fetches)."""
    return {p.relative_to(folder).as_posix(): p.stat().st_size
            for p in sorted(folder.rglob("*")) if p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(folder).parts)}


def hub_download(python: Path, endpoint: str, repo_id: str, cache_dir: Path) -> Path:
    """The real hub client's own CLI (`hf download`, from the engine venv that `python`
    belongs to) filling `cache_dir` the way the README's pre-fill Job does; returns the
    snapshot folder it reports."""
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1",
           "NO_COLOR": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    out = subprocess.run([str(python.parent / "hf"), "download", repo_id, "--cache-dir",
                          str(cache_dir)], env=env, capture_output=True, text=True, timeout=300)
    found = re.search(r"path: (\S+)", out.stdout)
    if out.returncode != 0 or not found:
        raise RuntimeError(f"hf download exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return Path(found.group(1))
