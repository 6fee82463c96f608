"""`make demo` (tests/sandbox/demo.sh) on the test session's sandbox: it must end by showing an
automatic rollback of the L40S pool only, served by a real engine (the other pools simulated),
whose real counters show the new K, and leave no pods holding the simulated GPUs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
L40S = "NVIDIA-L40S"


@pytest.mark.timeout(1800)  # two real engine starts: 1-2 min idle, far more on a busy machine
def test_demo_shows_an_automatic_rollback_of_one_real_pool(
    sandbox, kubectl, vllm_executable, tiny_model_dir
):
    env = {**os.environ, "MTP_SANDBOX_DIR": str(sandbox.state_dir), "PYTHON": sys.executable,
           "MTP_SANDBOX_STARTED_BY": "api"}  # the session still stops its sandbox at the end
    env.pop("MTP_DEMO_KEEP", None)
    p = subprocess.run(["bash", "tests/sandbox/demo.sh"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=1700)
    out = p.stdout
    print(out)
    assert p.returncode == 0, f"{out[-4000:]}\nstderr:\n{p.stderr[-3000:]}"
    assert re.search(r"deepseek-v3 .* A100:4 H100:4 H200:4 L40S:2\s+4/4\s+Ready", out)
    # which pools are real and which simulated
    assert len(re.findall(rf"deepseek-v3-\S+ +127\.\d+\.\S+ +{L40S} +2  REAL: mtp-runtime "
                          r"serve -> vLLM 0\.32\.0", out)) == 1
    assert len(re.findall(r"simulated: fake vLLM 0\.33\.0 /metrics", out)) == 3
    # the real engine: started, healthy on predictable traffic, fallen on unpredictable
    assert re.search(r"real engine \(K=2\) started in \d+\.\d s", out)
    m = re.search(r"real hit rate of the old engine \(K=2\): ([\d.]+) before the switch "
                  r"\((\d+) drafts\), ([\d.]+) after it \((\d+) drafts\)", out)
    assert m, out[-3000:]
    before, after = float(m[1]), float(m[3])
    assert before >= 0.88 > after and int(m[2]) > 0 and int(m[4]) > 0
    assert re.search(rf"operator rolled the {L40S} pool back to K=1 [\d.]+ s after the switch",
                     out)
    m = re.search(r"new real engine \(K=1\) started in [\d.]+ s; its counters: (\d+) draft "
                  r"tokens / (\d+) drafts", out)
    assert m and int(m[1]) == int(m[2]) > 0  # one draft token per draft: K=1, from the counters
    assert "real engines stopped (2 started: K 2 then 1)" in out
    # only that pool changed, and the resource says why
    assert re.search(r"deepseek-v3 .* A100:4 H100:4 H200:4 L40S:1\s+4/4\s+Ready", out)
    assert re.search(rf"deepseek-v3-l40s\s+{L40S}\s+1\s+1/1", out)
    assert "other pools unchanged" in out
    assert re.search(rf"{L40S}  K 2 -> 1  MTP\w+ .*\(via evaluator\)", out)
    assert "SpeculationRolledBack=True reason=RolledBack" in out
    assert re.search(rf"Warning\s+SpeculationRolledBack\s+deepseek-v3\s+pool {L40S}: "
                     r"K 2 -> 1 \(.*via evaluator\)", out)
    assert re.search(r"done in \d+ s \(\d+ s without the engine/model step\)", out)
    assert "make sandbox-down" in out.splitlines()[-1]
    assert not kubectl("get", "pods", "-n", "mtp-demo", "-o", "name").stdout.strip()
    assert not kubectl("get", "mtpi", "-n", "mtp-demo", "-o", "name").stdout.strip()
