"""Where the CPU goes while a benchmark phase runs.

Two views of one time window, for a target the scale issue's benchmarks missed:

- per process: CPU seconds every process on the machine used in the window (utime + stime from
  /proc), so a phase on shared cores shows how much of them the operator had, and how much the
  API server, etcd and the bench's own client took;
- inside one Python process (the operator): a py-spy profile (sampling, from outside the
  process; `pip install py-spy`), summed by the function that was running (self) and by every
  function on the stack (inclusive), and by library: our code, kopf, the Kubernetes client,
  the HTTP stacks, JSON, asyncio itself.

py-spy leaves out samples in which a thread waits (epoll, a lock, sleep), so samples / rate is
the process's time on a CPU as Python saw it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TOP_PROCESSES = 8

# (area, pattern on a frame's file): the first that matches names the frame's library
AREAS: tuple[tuple[str, str], ...] = (
    ("mtp_operator", r"mtp_operator/"),
    ("mtp_runtime", r"mtp_runtime/"),
    ("kopf", r"/kopf/"),
    ("lightkube", r"/lightkube/"),
    ("httpx/httpcore", r"/(httpx|httpcore|h11|anyio)/"),
    ("aiohttp", r"/(aiohttp|multidict|yarl)/"),
    ("pydantic", r"/pydantic(_core)?/"),
    ("json", r"/json/"),
    ("ssl", r"/ssl\.py"),
    ("asyncio", r"/asyncio/"),
    ("logging", r"/logging/"),
)

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def stat_cpu(pid: int | str) -> tuple[str, float] | None:
    """(command name, CPU seconds so far: utime + stime) of one process from /proc/<pid>/stat;
    None when it cannot be read (gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ..." ; comm may hold spaces and parentheses
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return comm, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_cpu() -> dict[int, tuple[str, float]]:
    """pid -> (command name, CPU seconds so far) for every process that can be read."""
    out: dict[int, tuple[str, float]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (got := stat_cpu(entry.name)) is not None:
            out[int(entry.name)] = got
    return out


def cpu_delta(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> list[dict[str, Any]]:
    """CPU each process used between two `process_cpu` snapshots, the most first (a process
    that ended in between is missing: its time is not counted)."""
    rows = []
    for pid, (comm, cpu) in after.items():
        was = before.get(pid)
        used = cpu - (was[1] if was and was[0] == comm else 0.0)
        if used > 0:
            rows.append({"pid": pid, "command": comm, "cpu_s": round(used, 3)})
    rows.sort(key=lambda r: -r["cpu_s"])
    return rows


def frame_key(frame: str) -> tuple[str, str]:
    """("function", "file") of one py-spy frame `function (file:line)`."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip(), ""
    return m["func"], m["file"]


def area_of(file: str) -> str:
    for area, pattern in AREAS:
        if re.search(pattern, file):
            return area
    return "python/stdlib" if "/lib/python" in file else "other"


def summarise(collapsed: str, rate: int, top: int = 15) -> dict[str, Any]:
    """Self and inclusive shares by function, and self shares by library, from py-spy's raw
    (collapsed-stack) output: one `frame;frame;...;frame count` line per distinct stack."""
    total = 0
    self_fn: Counter[tuple[str, str]] = Counter()
    incl_fn: Counter[tuple[str, str]] = Counter()
    self_area: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_key(f) for f in stack.split(";")]
        # the thread's name is py-spy's first frame when it is shown; frames then innermost last
        total += n
        self_fn[frames[-1]] += n
        self_area[area_of(frames[-1][1])] += n
        for key in set(frames):
            incl_fn[key] += n

    def rows(counter: Counter[tuple[str, str]]) -> list[dict[str, Any]]:
        return [
            {"function": f, "file": _short(file), "samples": n, "share": round(n / total, 4)}
            for (f, file), n in counter.most_common(top)
        ]

    return {
        "samples": total,
        "rate_hz": rate,
        "cpu_s": round(total / rate, 3) if rate else None,
        "by_area": [
            {"area": a, "samples": n, "share": round(n / total, 4)}
            for a, n in self_area.most_common()
        ] if total else [],
        "self": rows(self_fn) if total else [],
        # inclusive: our own functions only (the event loop and runpy are on every stack)
        "inclusive": rows(Counter({k: n for k, n in incl_fn.items()
                                   if area_of(k[1]) in ("mtp_operator", "mtp_runtime")}))
        if total else [],
    }


def _short(file: str) -> str:
    """A frame's file without the machine's paths: from site-packages/ or the package on."""
    for marker in ("site-packages/", "mtp_operator/", "mtp_runtime/"):
        if marker in file:
            return (marker if marker != "site-packages/" else "") + file.split(marker, 1)[1]
    return file.rsplit("/lib/", 1)[-1]


def py_spy() -> str | None:
    """py-spy beside this interpreter (the venv's), or on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def require_py_spy() -> str:
    """py-spy's path, or exit saying how to get it (`--profile` checks this up front too)."""
    exe = py_spy()
    if exe is None:
        raise SystemExit("--profile needs py-spy: pip install py-spy (make bench installs it)")
    return exe


SPY_RATE = 200  # samples a second


def spy_command(raw_path: Path, rate: int = SPY_RATE) -> list[str]:
    """`py-spy record` writing raw (collapsed) stacks to `raw_path`; add `--pid N`, or `--`
    and a command to start under it."""
    exe = require_py_spy()
    raw_path.parent.mkdir(parents=True, exist_ok=True)
    return [exe, "record", "--format", "raw", "--rate", str(rate), "--nonblocking",
            "--full-filenames", "-o", str(raw_path)]


class PhaseProfile:
    """`with PhaseProfile(pid, raw_path) as p: ...` then `p.result`: the window's CPU by
    process and, when py-spy is there (and `raw_path` given), the profile of `pid`."""

    def __init__(self, pid: int, raw_path: Path | None = None, rate: int = SPY_RATE) -> None:
        self.pid, self.raw_path, self.rate = pid, raw_path, rate
        self.result: dict[str, Any] = {}
        self._spy: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PhaseProfile:
        if self.raw_path is not None:
            self._spy = subprocess.Popen(
                [*spy_command(self.raw_path, self.rate), "--pid", str(self.pid)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
            time.sleep(0.5)  # attached before the phase starts
        self._t0, self._cpu0 = time.monotonic(), process_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.monotonic() - self._t0
        cpu = cpu_delta(self._cpu0, process_cpu())
        for row in cpu:
            if row["pid"] == self.pid:
                row["command"] = f"{row['command']} (profiled)"
            elif row["pid"] == os.getpid():
                row["command"] = f"{row['command']} (this bench)"
        self.result = {"wall_s": round(wall, 3), "cpu_by_process": cpu[:TOP_PROCESSES],
                       "cpu_total_s": round(sum(r["cpu_s"] for r in cpu), 3),
                       "cpus": os.cpu_count()}
        if self._spy is not None:
            self._spy.send_signal(signal.SIGINT)
            out, _ = self._spy.communicate(timeout=60)
            if self.raw_path and self.raw_path.exists():
                self.result["py_spy"] = summarise(self.raw_path.read_text(), self.rate)
            else:
                self.result["py_spy_error"] = out.decode(errors="replace")[-500:]
