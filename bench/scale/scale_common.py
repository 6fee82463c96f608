"""Shared by the scale benchmark's modules (bench/scale/run.py and bench/scale/scale_*.py):
paths, names and the log line."""

from __future__ import annotations

import re
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CRD = REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"
FLOOR_NS, OP_NS = "bench-floor", "bench-op"
SA_NS, SA_NAME = "mtp-system", "mtp-operator"
FIELD_MANAGER = "mtp-bench"
WRITE_VERBS = ("APPLY", "PATCH", "UPDATE", "CREATE", "POST", "PUT", "DELETE", "DELETECOLLECTION")
OPERATOR_COUNTERS = ("reconciles", "deployment_writes", "status_writes")
WRITE_COUNTERS = ("deployment_writes", "status_writes")
AUDIT_WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)
