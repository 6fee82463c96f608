"""The machine a benchmark ran on, for its results file (both bench scripts use it)."""

from __future__ import annotations

import contextlib
import os
import platform
from importlib.metadata import version
from pathlib import Path
from typing import Any

PACKAGES = ("kopf", "lightkube", "aiohttp", "httpx")


def machine(sb: Any, **extra: Any) -> dict[str, Any]:
    """CPU, memory, OS, Python, the sandbox's kube-apiserver and package versions, + `extra`."""
    mem_kib, cpu = 0, ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    packages = {}
    for mod in PACKAGES:
        with contextlib.suppress(Exception):
            packages[mod] = version(mod)
    kube: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        kube = sb.version()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "kube_apiserver": kube.get("gitVersion"),
        "packages": packages,
        **extra,
    }
