"""Scale benchmark: what is measured (API requests by verb, audit log, CPU, RSS, phases)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiling import stat_cpu
from scale_common import AUDIT_WRITE_VERBS, LABEL, SAMPLE, WRITE_VERBS

if TYPE_CHECKING:
    from scale_bench import Bench


class Requests:
    """apiserver_request_total from the kube-apiserver's /metrics, by (verb, resource)."""

    def __init__(self, sb: Any) -> None:
        self.sb = sb

    def snapshot(self) -> Counter[tuple[str, str]]:
        text = self.sb.api("GET", "/metrics", timeout=30)
        out: Counter[tuple[str, str]] = Counter()
        for line in text.splitlines():
            m = SAMPLE.match(line)
            if not m:
                continue
            labels = dict(LABEL.findall(m["labels"]))
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            out[(labels.get("verb", "?"), resource)] += int(float(m["value"]))
        return out


class Audit:
    """The operator's own requests, from the kube-apiserver's audit log: the operator runs as
    a ServiceAccount, and the sandbox audits ServiceAccount requests (Metadata level)."""

    def __init__(self, path: Path, user: str) -> None:
        self.path, self.user = path, user

    def offset(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def since(self, offset: int) -> Counter[tuple[str, str]]:
        out: Counter[tuple[str, str]] = Counter()
        with contextlib.suppress(OSError), self.path.open("rb") as f:
            f.seek(offset)
            for raw in f:
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                if (ev.get("user") or {}).get("username") != self.user:
                    continue
                verb = ev.get("verb", "?")
                # a watch is counted when it starts; everything else when it completes
                if ev.get("stage") != (
                    "ResponseStarted" if verb == "watch" else "ResponseComplete"
                ):
                    continue
                ref = ev.get("objectRef") or {}
                resource = ref.get("resource", "")
                if ref.get("subresource"):
                    resource += "/" + ref["subresource"]
                code = (ev.get("responseStatus") or {}).get("code", 0)
                if verb != "watch" and not 200 <= code < 300:
                    resource += f" [HTTP {code}]"  # a failed request (e.g. 504 under load)
                out[(verb, resource)] += 1
        return out


def writes_only(verbs: Mapping[str, int]) -> dict[str, int]:
    return {v: n for v, n in verbs.items() if v in AUDIT_WRITE_VERBS and n}


def by_verb(delta: Mapping[tuple[str, str], int]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for (verb, _), n in delta.items():
        out[verb] += n
    return dict(sorted(out.items()))


def diff(after: Counter, before: Counter) -> Counter:
    out = Counter(after)
    out.subtract(before)
    return Counter({k: v for k, v in out.items() if v})


def writes_by_resource(delta: Mapping[tuple[str, str], int]) -> dict[str, int]:
    return {f"{v} {r}": n for (v, r), n in sorted(delta.items()) if v in WRITE_VERBS and n}


def rollout_writes(
    requests: Mapping[tuple[str, str], int], deployments: int, resources: int
) -> dict[str, Any]:
    """The operator's writes in a rollout (audit log) against the least that carries the same
    information: one apply per Deployment and per Service, two status writes per resource
    (Progressing, Ready). Events are counted apart."""
    writes = {f"{v} {r}": n for (v, r), n in sorted(requests.items())
              if v in AUDIT_WRITE_VERBS and r != "events" and n}  # fmt: skip
    events = sum(n for (v, r), n in requests.items() if v in AUDIT_WRITE_VERBS and r == "events")
    minimum = deployments + resources + 2 * resources
    total = sum(writes.values())
    failed = sum(n for k, n in writes.items() if "[HTTP" in k)
    status = sum(n for k, n in writes.items() if k.endswith("/status"))
    return {"by_resource": writes, "total": total, "minimum": minimum,
            "ratio": round(total / minimum, 3) if minimum else None,
            "failed": failed,
            "ratio_succeeded": round((total - failed) / minimum, 3) if minimum else None,
            "status_writes": status,
            "status_writes_per_resource": round(status / resources, 2) if resources else None,
            "events": events}  # fmt: skip


def cpu_seconds(pid: int | None) -> float:
    got = stat_cpu(pid) if pid else None
    return got[1] if got else 0.0


def machine_busy_seconds() -> float:
    """CPU-seconds the whole machine has been busy (all CPUs, /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int | None) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Phase:
    """Wall time, API requests and CPU seconds (operator and sandbox components) of a phase."""

    def __init__(self, bench: Bench, name: str) -> None:
        self.bench, self.name = bench, name

    def __enter__(self) -> Phase:
        self.requests0 = self.bench.requests.snapshot()
        self.audit0 = self.bench.audit.offset()
        self.cpu0 = self.bench.cpu()
        self.busy0 = machine_busy_seconds()
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.t0
        self.delta = diff(self.bench.requests.snapshot(), self.requests0)
        self.operator_requests = self.bench.audit.since(self.audit0)
        cpu1 = self.bench.cpu()
        self.cpu = {k: round(cpu1.get(k, 0) - self.cpu0.get(k, 0), 2) for k in cpu1}
        # everything else on the machine meanwhile (other people's work on a shared machine)
        busy = machine_busy_seconds() - self.busy0
        self.cpu["machine_total"] = round(busy, 2)
        self.cpu["other_processes"] = round(
            busy - sum(v for k, v in self.cpu.items() if k not in ("machine_total",)), 2
        )

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 2),
            "requests_by_verb": by_verb(self.delta),
            "writes_by_resource": writes_by_resource(self.delta),
            "operator_requests_by_verb": by_verb(self.operator_requests),
            "operator_requests": {
                f"{v} {r}": n for (v, r), n in sorted(self.operator_requests.items())
            },
            "cpu_seconds": self.cpu,
        }
