"""The k-change bench's view of a Service (bench/k-change/k_change_cluster.py): which endpoints
of its EndpointSlices a client behind kube-proxy sends to, and when a pod left them."""

from __future__ import annotations

import json
import os
import signal
import time
from types import SimpleNamespace

import pytest

from support.scripts import load

kc = load("bench/k-change/k_change_cluster.py")


def _slice(*endpoints: tuple[str, str, dict], ports=(("http", 8000), ("metrics", 9400))):
    return {"ports": [{"name": n, "port": p} for n, p in ports],
            "endpoints": [{"addresses": [ip], "targetRef": {"name": name}, "conditions": cond}
                          for name, ip, cond in endpoints]}


READY = {"ready": True, "serving": True, "terminating": False}
DRAINING = {"ready": False, "serving": True, "terminating": True}
GONE = {"ready": False, "serving": False, "terminating": True}
STARTING = {"ready": False, "serving": False, "terminating": False}


def test_ready_endpoints_only_while_any_is_ready() -> None:
    slices = [_slice(("old", "10.0.0.1", DRAINING), ("new", "10.0.0.2", READY)),
              _slice(("starting", "10.0.0.3", STARTING))]
    assert [(t.name, t.host, t.port) for t in kc.usable_endpoints(slices)] == [
        ("new", "10.0.0.2", 8000)]


def test_without_a_ready_endpoint_the_serving_terminating_ones_take_traffic() -> None:
    # kube-proxy's fallback: a terminating pod that still passes its readiness probe serves
    slices = [_slice(("old", "10.0.0.1", DRAINING), ("gone", "10.0.0.4", GONE),
                     ("starting", "10.0.0.3", STARTING))]
    assert [t.name for t in kc.usable_endpoints(slices)] == ["old"]
    assert kc.usable_endpoints([_slice(("gone", "10.0.0.4", GONE))]) == []


def test_the_port_is_the_named_one_and_a_slice_without_it_gives_nothing() -> None:
    slices = [_slice(("a", "10.0.0.1", READY), ports=(("metrics", 9400), ("http", 8123)))]
    assert [t.port for t in kc.usable_endpoints(slices)] == [8123]
    assert kc.usable_endpoints([_slice(("a", "10.0.0.1", READY),
                                       ports=(("metrics", 9400),))]) == []


def test_left_at_is_the_last_time_each_pod_left() -> None:
    changes = [(1.0, ["a"]), (2.0, ["a", "b"]), (3.0, ["b"]), (4.0, ["a", "b"]),
               (5.0, ["b"]), (6.0, [])]
    assert kc.left_at(changes) == {"a": 5.0, "b": 6.0}


def test_served_while_draining_counts_successes_ending_after_the_pod_left() -> None:
    out = kc.k_change.Outcome
    outcomes = [out(0.0, 9.0, False, True, endpoint="old"),    # in flight when it left: saved
                out(0.0, 4.0, True, True, endpoint="old"),     # ended before it left
                out(0.0, 9.0, True, False, "reset", "old"),    # cut: not a success
                out(0.0, 9.0, False, True, endpoint="new")]    # another pod
    assert kc.served_while_draining(outcomes, {"old": 5.0}) == 1


def test_pod_k_reads_the_runtime_config() -> None:
    def pod(k):
        cfg = {"serve": {"num_speculative_tokens": k}}
        return {"spec": {"containers": [{"env": [
            {"name": "OTHER", "value": "x"},
            {"name": "MTP_RUNTIME_CONFIG", "value": kc.json.dumps(cfg)}]}]}}

    assert kc.pod_k(pod(3)) == 3
    assert kc.pod_k(pod("auto")) is None
    assert kc.pod_k({"spec": {"containers": [{"env": []}]}}) is None


def test_endpoint_states_name_every_endpoint_by_its_conditions() -> None:
    slices = [_slice(("old", "10.0.0.1", DRAINING), ("new", "10.0.0.2", READY)),
              _slice(("gone", "10.0.0.4", GONE), ("starting", "10.0.0.3", STARTING))]
    assert kc.endpoint_states(slices) == {"gone": "leaving", "new": "ready",
                                          "old": "draining", "starting": "not-ready"}
    assert kc.endpoint_states([]) == {}


# The tuner's trials as the bench's events (`trial_event`), from two reads of status.tuning.
CANARY = {"k": 4, "fromK": 2, "kind": "canary", "started": "2026-12-06T21:00:00Z"}
POOL_TRIAL = {"k": 4, "fromK": 2, "kind": "pool", "started": "2026-12-06T21:00:00Z"}


def _ended(trial: dict, outcome: str) -> dict:
    return {**trial, "ended": "2026-12-06T21:02:00Z", "outcome": outcome}


def test_a_trial_that_appears_is_its_start() -> None:
    assert kc.trial_event(None, 0, CANARY, []) == ("canary-start", CANARY)
    assert kc.trial_event(None, 3, POOL_TRIAL, []) == ("pool-trial-start", POOL_TRIAL)
    assert kc.trial_event(None, 0, None, []) is None
    assert kc.trial_event(CANARY, 0, CANARY, []) is None  # still running


def test_a_canary_ends_returned_or_adopted() -> None:
    returned, adopted = _ended(CANARY, "returned"), _ended(CANARY, "adopted")
    assert kc.trial_event(CANARY, 0, None, [returned]) == ("canary-end", returned)
    assert kc.trial_event(CANARY, 1, None, [{}, adopted]) == ("adoption", adopted)
    aborted = _ended(CANARY, "aborted")
    assert kc.trial_event(CANARY, 0, None, [aborted]) == ("canary-end", aborted)
    assert kc.trial_event(POOL_TRIAL, 0, None, [_ended(POOL_TRIAL, "returned")])[0] == \
        "pool-trial-end"


def test_an_end_not_yet_in_the_trials_is_no_event_and_an_end_shows_before_the_next_start() -> None:
    assert kc.trial_event(CANARY, 0, None, []) is None
    nxt = {**CANARY, "k": 1, "started": "2026-12-06T21:03:00Z"}
    assert kc.trial_event(CANARY, 0, nxt, [_ended(CANARY, "returned")])[0] == "canary-end"


def _pod(name: str, k: int, ready: bool = True, canary: bool = False, leaving: bool = False,
         created: str = "2026-12-06T20:00:00Z"):
    meta = {"name": name, "labels": {kc.LABEL_CANARY: "true"} if canary else {},
            "creationTimestamp": created}
    if leaving:
        meta["deletionTimestamp"] = "2026-12-06T21:01:00Z"
    env = [{"name": "MTP_RUNTIME_CONFIG",
            "value": json.dumps({"serve": {"num_speculative_tokens": k}})}]
    return {"metadata": meta, "spec": {"containers": [{"env": env}], "nodeName": "n"},
            "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}


def _kubectl(pods):
    return lambda *a, **kw: SimpleNamespace(stdout=json.dumps({"items": pods}))


def test_a_canary_start_is_carried_out_once_the_canary_is_ready_and_nothing_terminates() -> None:
    pool = [_pod("a", 2), _pod("b", 2)]
    settled = kc.trial_settled
    assert settled(_kubectl([*pool, _pod("c", 4, ready=False, canary=True)]), "ns", "r",
                   "canary-start", CANARY, 2) is None
    assert settled(_kubectl([*pool, _pod("c", 4, canary=True)]), "ns", "r", "canary-start",
                   CANARY, 2)
    assert settled(_kubectl([_pod("a", 2), _pod("b", 2, leaving=True),
                             _pod("c", 4, canary=True)]), "ns", "r", "canary-start",
                   CANARY, 2) is None


def test_an_end_is_carried_out_at_the_k_the_pool_keeps_without_the_canary() -> None:
    settled = kc.trial_settled
    at_2, at_4 = [_pod("a", 2), _pod("b", 2)], [_pod("a", 4), _pod("b", 4)]
    returned, adopted = _ended(CANARY, "returned"), _ended(CANARY, "adopted")
    assert settled(_kubectl(at_2), "ns", "r", "canary-end", returned, 2)
    assert settled(_kubectl([*at_2, _pod("c", 4, canary=True, leaving=True)]), "ns", "r",
                   "canary-end", returned, 2) is None
    assert settled(_kubectl(at_2), "ns", "r", "adoption", adopted, 2) is None
    assert settled(_kubectl(at_4), "ns", "r", "adoption", adopted, 2)
    assert settled(_kubectl([_pod("a", 4)]), "ns", "r", "pool-trial-start", POOL_TRIAL, 1)
    # the next trial's canary (made after this one ended, same name) does not hold the end up;
    # the ended trial's own canary, made before its end, does until it is gone
    nxt = _pod("c", 4, ready=False, canary=True, created="2026-12-06T21:02:20Z")
    assert settled(_kubectl([*at_2, nxt]), "ns", "r", "canary-end", returned, 2)
    own = _pod("c", 4, canary=True, created="2026-12-06T21:00:05Z")
    assert settled(_kubectl([*at_2, own]), "ns", "r", "canary-end", returned, 2) is None


def _ev(kind: str, sent: int, failed: int, outcome: str | None = None) -> dict:
    trial = {"kind": "canary", "outcome": outcome} if kind.startswith("canary") else None
    return {"kind": kind, "trial": trial, "requests": {"sent": sent, "failed": failed}}


def test_totals_sum_every_operator_run_per_replicas_rollout_and_kind() -> None:
    runs = [
        {"harness": "operator", "when": "t1", "replicas": 2, "rollout": "surge",
         "events": [_ev("rollback", 10, 0), _ev("canary-end", 4, 0, "returned"),
                    _ev("rollback", 7, 1)]},
        {"harness": "operator", "when": "t2", "replicas": 2, "rollout": "surge",
         "events": [_ev("rollback", 5, 0), _ev("canary-end", 3, 0, "returned"),
                    _ev("canary-end", 2, 0, "aborted")]},
        {"harness": "operator", "when": "t3", "replicas": 3, "rollout": "surge",
         "events": [_ev("rollback", 9, 0)]},
        {"harness": "processes", "when": "t0", "replicas": 2, "rollout": "surge",
         "events": [_ev("rollback", 100, 50)]},  # the harness's runs are not counted
    ]
    rows = {(r["replicas"], r["event"]): r for r in kc.totals(runs)}
    assert set(rows) == {(2, "rollback"), (2, "canary-end"), (3, "rollback")}
    assert (rows[2, "rollback"]["events"], rows[2, "rollback"]["sent"],
            rows[2, "rollback"]["failed"], rows[2, "rollback"]["runs"]) == (3, 22, 1, 2)
    assert rows[2, "canary-end"]["outcomes"] == {"returned": 2, "aborted": 1}
    assert rows[2, "rollback"]["outcomes"] == {}
    assert "| 2 | surge | canary-end | 3 | 2 | 9 | 0 | aborted 1, returned 2 |" in (
        kc.totals_markdown(runs))


# `--reset-ks`: after each adoption the spec's K is edited so the tuner starts over.
def test_the_reset_k_takes_the_list_in_turn_never_the_adopted_k_nor_the_spec_k() -> None:
    assert [kc.reset_k([0, 1, 2], 4, n, 3) for n in range(4)] == [0, 1, 2, 0]
    assert kc.reset_k([0, 2], 0, 0, 3) == 2  # the turn's K is the adopted one: the next
    assert kc.reset_k([0, 2], 2, 1, 3) == 0
    # the spec's K stays 0 while the tuner adopts 4: an "edit" to 0 would be no edit (the
    # 2026-12-07 12:55 run waited for a pool at K=0 that kept its tuned K=4)
    assert kc.reset_k([0, 2], 4, 0, 0) == 2
    assert kc.reset_k([0, 2], 4, 1, 2) == 0
    try:
        kc.reset_k([3, 4], 3, 0, 4)
    except ValueError as err:
        assert "--reset-ks" in str(err) and "K=3" in str(err) and "K=4" in str(err)
    else:
        raise AssertionError("no K to edit to was accepted")


def test_a_spec_edit_settles_on_the_pool_pods_whatever_canary_the_tuner_starts() -> None:
    pods = [_pod("a", 0), _pod("b", 0), _pod("c", 4, ready=False, canary=True)]
    assert kc.settled_pods(pods, 0, 2) is None  # counted with the canary: three pods
    assert [p["metadata"]["name"] for p in kc.settled_pods(kc.without_canaries(pods), 0, 2)] \
        == ["a", "b"]
    assert kc.settled_pods(kc.without_canaries([_pod("a", 0), _pod("b", 4)]), 0, 2) is None


# `--template before`: the pool's Deployment as the operator rendered it before issue 37.
def _deployment(k: int = 2) -> dict:
    pod = _pod("t", k)
    c = pod["spec"]["containers"][0]
    c["env"] += [{"name": "MTP_RUNTIME_DRAIN_SECONDS", "value": "120"},
                 {"name": "OMP_NUM_THREADS", "value": "1"}]
    c["readinessProbe"] = {"httpGet": {"path": "/ready", "port": "metrics"}, "periodSeconds": 2}
    c["lifecycle"] = {"preStop": {"exec": {"command": ["mtp-runtime", "drain"]}}}
    pod["spec"]["terminationGracePeriodSeconds"] = 150
    return {"metadata": {"name": "d", "resourceVersion": "7", "uid": "u", "managedFields": []},
            "spec": {"strategy": {"type": "RollingUpdate",
                                  "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                     "template": {"metadata": {}, "spec": pod["spec"]}},
            "status": {"replicas": 2}}


def test_the_before_template_undoes_each_part_of_the_fix_and_keeps_the_rest() -> None:
    deploy = _deployment()
    out = kc.before_template(deploy)
    pod = out["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert out["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http",
                                              "scheme": "HTTP"}
    assert "lifecycle" not in c and pod["terminationGracePeriodSeconds"] == 30
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["MTP_RUNTIME_DRAIN_SECONDS"] == "0"
    assert env["MTP_RUNTIME_ENGINE_ARGS"] == "--shutdown-timeout 0"
    assert env["OMP_NUM_THREADS"] == "1" and len(c["env"]) == len(env)  # no name twice
    assert kc.pod_k({"spec": pod}) == 2  # K untouched
    assert "status" not in out and "resourceVersion" not in out["metadata"]
    assert deploy["spec"]["template"]["spec"]["containers"][0]["lifecycle"]  # input kept
    assert kc.is_before({"spec": pod}) and not kc.is_before({"spec": deploy["spec"]["template"][
        "spec"]})


def test_a_k_rollout_changes_only_the_pods_k() -> None:
    deploy = kc.before_template(_deployment(2))
    out = kc.with_k(deploy, 4)
    assert kc.pod_k(out["spec"]["template"]) == 4 and kc.pod_k(deploy["spec"]["template"]) == 2
    assert kc.is_before(out["spec"]["template"])
    out["spec"]["template"]["spec"]["containers"][0]["env"] = [
        e for e in out["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] != "MTP_RUNTIME_CONFIG"]
    try:
        kc.with_k(out, 2)
    except ValueError as err:
        assert "MTP_RUNTIME_CONFIG" in str(err)
    else:
        raise AssertionError("a Deployment without the runtime config was edited")


def test_before_runs_are_their_own_rows() -> None:
    assert kc.rollout_label({"rollout": "no-surge", "template": "before"}) == \
        "no-surge, before-fix template"
    assert kc.rollout_label({"rollout": "surge", "template": "after"}) == "surge"


def test_the_first_sigterm_ends_the_change_loop_and_a_second_kills() -> None:
    saved = signal.getsignal(signal.SIGTERM)
    try:
        kc.stop_on_sigterm()
        with pytest.raises(kc.Stopped, match="signal 15"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode; never reached
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, saved)
