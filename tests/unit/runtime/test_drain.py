"""The drain decision and its loop (mtp_runtime.drain), on a fake clock: no sleeping."""

from __future__ import annotations

import pytest

from mtp_runtime import drain
from mtp_runtime.drain import Load, decide

pytestmark = pytest.mark.unit

IDLE = Load(0, 0)
BUSY = Load(running=2, waiting=1)


def test_decide_order() -> None:
    s = drain.SETTLE_S
    # settling: an idle vLLM is not enough before the endpoint's removal has spread
    assert decide(s / 2, 120, IDLE, 5, 0) == drain.Step(False, "settling")
    assert decide(s, 120, IDLE, drain.IDLE_READS, 0) == drain.Step(True, "idle")
    assert decide(s, 120, IDLE, drain.IDLE_READS - 1, 0) == drain.Step(False, "busy")
    assert decide(s, 120, BUSY, 0, 0) == drain.Step(False, "busy")
    assert decide(s, 120, Load(0, 1), 0, 0).reason == "busy"  # waiting counts too
    # the timeout wins over everything, settling included
    assert decide(120, 120, BUSY, 0, 0) == drain.Step(True, "timeout")
    assert decide(0, 0, IDLE, 9, 0) == drain.Step(True, "timeout")
    # vLLM gone: nothing to wait for, once it has not answered UNREACHABLE_READS times
    assert decide(1, 120, None, 0, drain.UNREACHABLE_READS - 1).reason == "settling"
    assert decide(s, 120, None, 0, drain.UNREACHABLE_READS - 1).reason == "unreachable"
    assert decide(1, 120, None, 0, drain.UNREACHABLE_READS) == drain.Step(True,
                                                                          "vllm_unreachable")


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_run_waits_for_the_requests_then_two_idle_reads() -> None:
    clock = Clock(1000.0)
    loads = iter([BUSY] * 8 + [IDLE, BUSY, IDLE, IDLE, IDLE])
    result = drain.run(lambda: next(loads), clock.now, clock.sleep, timeout_s=120,
                       started_at=1000.0, settle_s=5, interval_s=1)
    # reads at t=0..11: busy until t=7, idle at 8, busy at 9 (a new request: idle again from
    # 0), idle at 10 and 11 → done on the second idle read in a row
    assert result.reason == "idle"
    assert result.reads == 12
    assert result.elapsed_s == 11 and result.waited_s == 11
    assert result.last == IDLE


def test_run_continues_an_earlier_drain_and_stops_at_its_deadline() -> None:
    clock = Clock(1000.0)
    # the preStop began 100 s ago with a 120 s budget: 20 s are left, vLLM stays busy
    result = drain.run(lambda: BUSY, clock.now, clock.sleep, timeout_s=120, started_at=900.0,
                       settle_s=5, interval_s=3)
    assert result.reason == "timeout"
    assert result.elapsed_s == 120 and result.waited_s == 20
    assert sum(clock.sleeps) == 20  # the last sleep is cut to the deadline, never beyond it
    assert max(clock.sleeps) == 3


def test_run_with_the_settle_already_past_ends_on_idle_at_once() -> None:
    clock = Clock(50.0)
    result = drain.run(lambda: IDLE, clock.now, clock.sleep, timeout_s=120, started_at=0.0)
    assert (result.reason, result.reads, result.waited_s) == ("idle", 2, drain.READ_INTERVAL_S)


def test_load_from_vllm_metrics() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
    )
    assert drain.load_from_metrics(text) == Load(running=4, waiting=2)
    assert drain.load_from_metrics("# nothing\nother_metric 1\n") is None


@pytest.mark.parametrize("raw", ["abc", "-1", "nan", "inf"])
def test_bad_drain_seconds_name_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match=drain.DRAIN_SECONDS_ENV):
        drain.parse_seconds(raw, drain.DRAIN_SECONDS_ENV)


def test_drain_seconds_default_and_value() -> None:
    assert drain.parse_seconds(None, "X") == drain.DEFAULT_DRAIN_SECONDS
    assert drain.parse_seconds(" ", "X", 7) == 7
    assert drain.parse_seconds("300", "X") == 300
