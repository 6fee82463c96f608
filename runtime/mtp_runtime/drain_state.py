"""The files `mtp-runtime serve` and `mtp-runtime drain` (the pod's preStop, another process
in the same container) share: where vLLM's /metrics is, and the drain marker (its presence
makes `/ready` answer 503; its text is the drain's start, a Unix time).

They live in `$MTP_RUNTIME_STATE_DIR`, else `/dev/shm/mtp-runtime-<vLLM port>` (the pod's
memory volume, writable under a read-only root file system; the port keeps several runtimes
on one machine, as in the tests, apart), else the same name under the temp directory.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from mtp_runtime.drain import STATE_DIR_ENV

MARKER = "draining"
SERVE_FILE = "serve.json"


def state_dir(port: int, environ: Mapping[str, str] = os.environ) -> Path:
    explicit = environ.get(STATE_DIR_ENV, "").strip()
    if explicit:
        return Path(explicit)
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"mtp-runtime-{port}"


def begin(directory: Path, now: float | None = None) -> float:
    """Mark the pod as draining (once: a second call keeps the first start); the start."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / MARKER
    started = started_at(directory)
    if started is not None:
        return started
    started = time.time() if now is None else now
    tmp = directory / f".{MARKER}.{os.getpid()}"
    tmp.write_text(f"{started:.3f}\n")
    os.replace(tmp, marker)
    return started


def started_at(directory: Path) -> float | None:
    """When the drain began, or None when the pod is not draining. An unreadable marker
    still means draining (its start: the file's modification time)."""
    marker = directory / MARKER
    try:
        text = marker.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError:
        return marker.stat().st_mtime if marker.exists() else None
    try:
        return float(text)
    except ValueError:
        return marker.stat().st_mtime


def clear(directory: Path) -> None:
    """A new serve starts undrained (a marker left by an earlier container in the same pod
    would keep it from ever being Ready)."""
    for name in (MARKER, SERVE_FILE):
        try:
            (directory / name).unlink()
        except FileNotFoundError:
            pass


def write_serve(directory: Path, metrics_url: str, drain_seconds: float) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{SERVE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"metrics_url": metrics_url, "drain_seconds": drain_seconds}))
    os.replace(tmp, directory / SERVE_FILE)


def read_serve(directory: Path) -> dict[str, object] | None:
    try:
        data = json.loads((directory / SERVE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
