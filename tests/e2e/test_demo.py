"""`make demo` (tests/sandbox/demo.sh) on the test session's sandbox: it must end by showing an
automatic rollback of the H100 pool only, and leave no pods holding the simulated GPUs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_shows_an_automatic_rollback_of_one_pool(sandbox, kubectl):
    env = {**os.environ, "MTP_SANDBOX_DIR": str(sandbox.state_dir), "PYTHON": sys.executable,
           "MTP_SANDBOX_STARTED_BY": "api"}  # the session still stops its sandbox at the end
    env.pop("MTP_DEMO_KEEP", None)
    p = subprocess.run(["bash", "tests/sandbox/demo.sh"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=180)
    out = p.stdout
    assert p.returncode == 0, f"{out[-4000:]}\nstderr:\n{p.stderr[-3000:]}"
    assert re.search(r"deepseek-v3 .* A100:4 H100:4 H200:4 L40S:2\s+4/4\s+Ready", out)
    assert re.search(r"deepseek-v3 .* A100:4 H100:3 H200:4 L40S:2\s+4/4\s+Ready", out)
    assert re.search(r"deepseek-v3-h100-80gb-hbm3\s+NVIDIA-H100-80GB-HBM3\s+3\s+1/1", out)
    assert "other pools unchanged" in out
    assert re.search(r"NVIDIA-H100-80GB-HBM3  K 4 -> 3  MTP\w+ .*\(via evaluator\)", out)
    assert "SpeculationRolledBack=True reason=RolledBack" in out
    assert re.search(r"Warning\s+SpeculationRolledBack\s+deepseek-v3\s+pool NVIDIA-H100-80GB-HBM3: "
                     r"K 4 -> 3 \(.*via evaluator\)", out)
    assert "make sandbox-down" in out.splitlines()[-1]
    assert not kubectl("get", "pods", "-n", "mtp-demo", "-o", "name").stdout.strip()
    assert not kubectl("get", "mtpi", "-n", "mtp-demo", "-o", "name").stdout.strip()
