"""The operator's Alertmanager webhook (POST /alerts) against the real operator on the sandbox.

Payloads are Alertmanager's webhook v4 as Alertmanager 0.25 sends them. Every test checks
what the cluster shows afterwards (pool Deployments, status.rollbacks, Events), not only the
HTTP answers, and the operator's own counters (adapters/telemetry.py).
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from support.cluster_fixtures import wait_for
from support.mtpi import (
    A100,
    H100,
    H200,
    L40S,
    apply,
    deployments,
    events,
    metric,
    pool,
    pool_ks,
    resource,
    settings_hashes,
    wait_ready,
)
from support.operator_proc import free_port
from support.pool_fakes import PoolWatch

TOKEN = "webhook-e2e-token"


def iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


T0 = datetime.now(UTC).replace(microsecond=0)


def am_alert(
    namespace: str,
    resource_name: str,
    product: str,
    *,
    alertname: str = "MTPHitRateLow",
    value: str | None = "0.61",
    threshold: str = "0.88",
    status: str = "firing",
    starts: datetime = T0,
    ends: datetime | None = None,
    fingerprint: str | None = None,
    drop: tuple[str, ...] = (),
) -> dict[str, Any]:
    labels = {"alertname": alertname, "namespace": namespace, "mtpinference": resource_name,
              "gpu_product": product, "severity": "warning"}
    for label in drop:
        labels.pop(label)
    annotations = {"summary": "MTP hit rate low", "threshold": threshold}
    if value is not None:
        annotations["value"] = value
    return {
        "status": status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": iso(starts),
        "endsAt": iso(ends) if ends else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.example/graph",
        "fingerprint": fingerprint or f"{abs(hash((resource_name, product, alertname))):016x}",
    }


def payload(alerts: list[dict[str, Any]]) -> bytes:
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return json.dumps({
        "version": "4", "groupKey": '{}:{alertname="MTPHitRateLow"}', "truncatedAlerts": 0,
        "status": status, "receiver": "mtp-operator", "groupLabels": {}, "commonLabels": {},
        "commonAnnotations": {}, "externalURL": "http://alertmanager.example",
        "alerts": alerts,
    }).encode()


class Webhook:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/alerts"

    def post(self, body: bytes, token: str | None = TOKEN,
             authorization: str | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
        headers = {"Content-Type": "application/json"}
        if authorization is not None:
            headers["Authorization"] = authorization
        elif token is not None:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"{}"), dict(r.headers)
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                doc = json.loads(text)
            except ValueError:
                doc = {"raw": text.decode(errors="replace")}
            return e.code, doc, dict(e.headers)


@pytest.fixture
def webhook_operator(start_operator, namespace, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    op = start_operator("--namespace", namespace, "--no-evaluator",
                        "--alerts-address", f"127.0.0.1:{port}",
                        "--alerts-token-file", str(token_file))
    return op, Webhook(port)


def ready_resource(kubectl, namespace: str, name: str = "dsv3", **spec: Any) -> dict:
    apply(kubectl, namespace, name, speculative={"mtpLayers": 1}, **spec)
    obj = wait_ready(kubectl, namespace, name)
    assert pool_ks(obj) == {A100: 4, H100: 6, H200: 6, L40S: 2}
    return obj


def assert_untouched(kubectl, namespace: str, obj: dict, hashes: dict[str, str]) -> None:
    name = obj["metadata"]["name"]
    now = resource(kubectl, namespace, name)
    assert not now["status"].get("rollbacks"), now["status"]["rollbacks"]
    assert pool_ks(now) == pool_ks(obj)
    assert settings_hashes(deployments(kubectl, namespace, name)) == hashes
    assert not events(kubectl, namespace, "SpeculationRolledBack", name)


def test_missing_or_wrong_token_is_refused_and_changes_nothing(
    kubectl, namespace, webhook_operator
):
    op, hook = webhook_operator
    obj = ready_resource(kubectl, namespace)
    hashes = settings_hashes(deployments(kubectl, namespace))
    body = payload([am_alert(namespace, "dsv3", H100)])
    for kw in ({"token": None}, {"token": "wrong"}, {"token": TOKEN + "x"},
               {"authorization": f"Basic {TOKEN}"}, {"authorization": TOKEN}):
        code, doc, headers = hook.post(body, **kw)
        assert code == 401, (kw, code, doc)
        assert headers.get("WWW-Authenticate") == "Bearer"
    assert metric(op, "mtp_operator_alert_requests_rejected_total", reason="unauthorized") == 5
    assert metric(op, "mtp_operator_alerts_received_total") == 0
    assert_untouched(kubectl, namespace, obj, hashes)

    # The same notification with the right token acts: the refusals were about the token.
    code, doc, _ = hook.post(body)
    assert (code, doc["changed"]) == (200, 1), doc
    obj = resource(kubectl, namespace, "dsv3")
    assert [(r["gpuProduct"], r["toK"], r["via"]) for r in obj["status"]["rollbacks"]] == [
        (H100, 5, "alertmanager")]


def test_malformed_payloads_get_400_and_change_nothing(kubectl, namespace, webhook_operator):
    op, hook = webhook_operator
    obj = ready_resource(kubectl, namespace)
    hashes = settings_hashes(deployments(kubectl, namespace))
    good = json.loads(payload([am_alert(namespace, "dsv3", H100)]))
    bad_bodies = {
        "not json": b"{not json",
        "binary": b"\xff\xfe\x00",
        "json array": b"[]",
        "no alerts": json.dumps({k: v for k, v in good.items() if k != "alerts"}).encode(),
        "alerts not a list": json.dumps({**good, "alerts": {"a": 1}}).encode(),
        "bad alert status": json.dumps(
            {**good, "alerts": [{**good["alerts"][0], "status": "burning"}]}).encode(),
        "labels not strings": json.dumps(
            {**good, "alerts": [{**good["alerts"][0], "labels": {"alertname": 1}}]}).encode(),
        "webhook version 3": json.dumps({**good, "version": "3"}).encode(),
    }
    for what, body in bad_bodies.items():
        code, doc, _ = hook.post(body)
        assert code == 400, (what, code, doc)
        assert doc.get("error"), (what, doc)
    assert metric(op, "mtp_operator_alert_requests_rejected_total", reason="malformed") == len(
        bad_bodies)
    code, doc, _ = hook.post(b" " * (8 * 1024 * 1024 + 10))  # over the 8 MiB limit
    assert code == 413, doc
    assert_untouched(kubectl, namespace, obj, hashes)
    code, _, _ = hook.post(json.dumps(good).encode())  # and the receiver still works
    assert code == 200


def test_unknown_targets_other_alerts_and_no_data_are_accepted_and_ignored(
    kubectl, namespace, webhook_operator
):
    op, hook = webhook_operator
    obj = ready_resource(kubectl, namespace)
    hashes = settings_hashes(deployments(kubectl, namespace))
    cases = [
        # (alert, ignored reason or None for "handled, unchanged")
        (am_alert(namespace, "no-such-resource", H100), "unknown_target"),
        (am_alert("no-such-namespace", "dsv3", H100), "unknown_target"),
        (am_alert(namespace, "dsv3", "NVIDIA-B200"), "unknown_target"),  # no such pool
        (am_alert(namespace, "dsv3", H100, alertname="Watchdog"), "not_rollback_alert"),
        (am_alert(namespace, "dsv3", H100, alertname="KubePodCrashLooping"),
         "not_rollback_alert"),
        (am_alert(namespace, "dsv3", H100, drop=("gpu_product",)), "missing_labels"),
        (am_alert(namespace, "dsv3", H100, drop=("namespace", "mtpinference")),
         "missing_labels"),
        (am_alert(namespace, "dsv3", H100, value=None, fingerprint="f-novalue"), None),
        # not a finite value in [0, 1]: no data, counted apart
        (am_alert(namespace, "dsv3", H100, value="NaN", fingerprint="f-nan"), "impossible_value"),
        (am_alert(namespace, "dsv3", H100, value="high", fingerprint="f-text"), None),
        # within this resource's threshold (0.88): not acted on
        (am_alert(namespace, "dsv3", H100, value="0.93", fingerprint="f-fine"), None),
        (am_alert(namespace, "dsv3", L40S, alertname="MTPErrorPropagationHigh", value="0.2",
                  threshold="0.4", fingerprint="f-ep-fine"), None),
    ]
    for alert, reason in cases:
        code, doc, _ = hook.post(payload([alert]))
        assert code == 200, (alert, doc)
        assert doc["changed"] == 0, (alert, doc)
        if reason:
            assert doc["ignored"] == {reason: 1}, (alert, doc)
        else:
            assert (doc["ignored"], doc["unchanged"]) == ({}, 1), (alert, doc)
    for reason in ("unknown_target", "not_rollback_alert", "missing_labels", "impossible_value"):
        want = sum(1 for _, r in cases if r == reason)
        assert metric(op, "mtp_operator_alerts_ignored_total", reason=reason) == want, reason
    unchanged = sum(1 for _, r in cases if r is None)
    assert metric(op, "mtp_operator_alert_signals_handled_total", outcome="unchanged") == unchanged
    assert metric(op, "mtp_operator_alert_signals_handled_total", outcome="changed") == 0
    assert metric(op, "mtp_operator_rollbacks_total") == 0
    assert_untouched(kubectl, namespace, obj, hashes)


def test_duplicates_repeats_and_resolved_are_idempotent(
    kubeconfig, kubectl, namespace, webhook_operator
):
    op, hook = webhook_operator
    ready_resource(kubectl, namespace)
    hashes = settings_hashes(deployments(kubectl, namespace))
    first = am_alert(namespace, "dsv3", H100, fingerprint="fp-h100")
    with PoolWatch(kubeconfig, namespace) as watch:
        code, doc, _ = hook.post(payload([first, first]))  # the same alert twice in one body
        assert (code, doc["changed"], doc["ignored"]) == (200, 1, {"duplicate": 1}), doc
        for _ in range(3):  # Alertmanager retries / an HA pair: the same notification again
            code, doc, _ = hook.post(payload([first]))
            assert (code, doc["changed"], doc["ignored"]) == (200, 0, {"duplicate": 1}), doc
        resolved = {**first, "status": "resolved", "endsAt": iso(datetime.now(UTC))}
        code, doc, _ = hook.post(payload([resolved]))
        assert (code, doc["changed"], doc["unchanged"]) == (200, 0, 1), doc
        # It fires again (new startsAt), and the other alert for the same pool: in cooldown.
        again = {**first, "startsAt": iso(T0 + timedelta(seconds=30))}
        other = am_alert(namespace, "dsv3", H100, alertname="MTPErrorPropagationHigh",
                         value="0.62", threshold="0.4", fingerprint="fp-h100-ep")
        code, doc, _ = hook.post(payload([again, other]))
        assert (code, doc["changed"], doc["unchanged"]) == (200, 0, 2), doc
        change = watch.wait(lambda c: c.product == H100, timeout=10)
        assert change.k == 5
        time.sleep(1)  # anything the operator would still do would show within a second

    obj = resource(kubectl, namespace, "dsv3")
    (record,) = obj["status"]["rollbacks"]
    assert (record["gpuProduct"], record["fromK"], record["toK"]) == (H100, 6, 5)
    assert pool(obj, H100)["lastAlertTime"] >= record["time"]
    assert [c.product for c in watch.since(0)] == [H100]
    now = settings_hashes(deployments(kubectl, namespace))
    assert {p for p in hashes if hashes[p] != now[p]} == {H100}
    assert len(events(kubectl, namespace, "SpeculationRolledBack", "dsv3")) == 1
    assert metric(op, "mtp_operator_rollbacks_total") == 1
    assert metric(op, "mtp_operator_alerts_ignored_total", reason="duplicate") == 4


def test_a_burst_of_1000_alerts_rolls_each_pool_back_exactly_once(
    kubeconfig, kubectl, namespace, webhook_operator
):
    op, hook = webhook_operator
    names = ("burst-a", "burst-b")
    for name in names:
        apply(kubectl, namespace, name, speculative={"mtpLayers": 1})
    ks = {name: pool_ks(wait_ready(kubectl, namespace, name)) for name in names}
    pools = [(n, p) for n in names for p in ks[n]]
    assert len(pools) == 8

    rng = random.Random(5)
    alerts = []
    for i in range(1000):
        kind = rng.random()
        name, product = rng.choice(pools)
        if kind < 0.05:
            name = "burst-unknown"
        elif kind < 0.10:
            product = "NVIDIA-B200"
        alertname = rng.choice(["MTPHitRateLow", "MTPErrorPropagationHigh"])
        value, threshold = ("0.55", "0.88") if alertname == "MTPHitRateLow" else ("0.61", "0.4")
        status = "resolved" if rng.random() < 0.1 else "firing"
        starts = T0 + timedelta(seconds=rng.randrange(60))
        alerts.append(am_alert(
            namespace, name, product, alertname=alertname, value=value, threshold=threshold,
            status=status, starts=starts,
            ends=starts + timedelta(seconds=5) if status == "resolved" else None,
            fingerprint=f"{name}-{product}-{alertname}-{i % 300}",
        ))
    bodies = [payload(alerts[i:i + 10]) for i in range(0, len(alerts), 10)]
    with PoolWatch(kubeconfig, namespace) as watch, ThreadPoolExecutor(8) as pool_exec:
        t0 = time.monotonic()
        answers = list(pool_exec.map(hook.post, bodies))
        took = time.monotonic() - t0
        assert [code for code, *_ in answers] == [200] * len(bodies), [
            a for a in answers if a[0] != 200][:3]
        # every pool was addressed by a firing alert over its threshold: each rolls back once
        wait_for(lambda: {(c.resource, c.product) for c in watch.since(0)} == set(pools), 30,
                 message="every pool rolled back")
        time.sleep(1)
        changes = watch.since(0)
    print(f"\nburst: {len(alerts)} alerts in {len(bodies)} requests answered in {took:.2f}s")
    assert sorted((c.resource, c.product) for c in changes) == sorted(pools)
    for name in names:
        obj = resource(kubectl, namespace, name)
        records = obj["status"]["rollbacks"]
        assert sorted(r["gpuProduct"] for r in records) == sorted(ks[name]), records
        for r in records:
            assert r["toK"] < r["fromK"] == ks[name][r["gpuProduct"]]
            assert pool(obj, r["gpuProduct"])["numSpeculativeTokens"] == r["toK"]
    assert metric(op, "mtp_operator_rollbacks_total") == 8
    assert sum(doc["changed"] for _, doc, _ in answers) == 8
    assert metric(op, "mtp_operator_alert_requests_total", code="200") == len(bodies)
    received = metric(op, "mtp_operator_alerts_received_total")
    assert received == 1000  # every alert carried the labels and a rollback alert name
    with urllib.request.urlopen(op.url("/healthz"), timeout=5) as r:
        assert r.status == 200
    assert op.proc is not None and op.proc.poll() is None, op.log_tail()
    assert "Traceback" not in op.log_path.read_text()


def test_a_namespace_that_has_not_opted_in_is_not_rolled_back_from_the_webhook(
    kubectl, namespace, webhook_operator
):
    """Issue 36, what one token may do: with the operator's default settings
    (alerts.requireNamespaceOptIn) the webhook acts only on resources whose Namespace carries
    mtp-operator.io/alert-rollback=enabled. Without it a valid alert is accepted (200,
    Alertmanager must not retry), counted as namespace_not_opted_in, and changes nothing; once
    the label is set (seen within the operator's 10 s cache) the same alert acts."""
    from mtp_operator.adapters.namespaces import OPT_IN_CACHE_SECONDS

    op, hook = webhook_operator
    kubectl("label", "namespace", namespace, "mtp-operator.io/alert-rollback-")
    obj = ready_resource(kubectl, namespace)
    hashes = settings_hashes(deployments(kubectl, namespace))
    code, doc, _ = hook.post(payload([am_alert(namespace, "dsv3", H100, fingerprint="a1")]))
    assert code == 200, doc
    assert (doc["changed"], doc["unchanged"]) == (0, 0), doc
    assert doc["ignored"] == {"namespace_not_opted_in": 1}, doc
    assert metric(op, "mtp_operator_alerts_ignored_total", reason="namespace_not_opted_in") == 1
    assert_untouched(kubectl, namespace, obj, hashes)
    assert "not opted in" in op.log_path.read_text(errors="replace")

    kubectl("label", "namespace", namespace, "mtp-operator.io/alert-rollback=enabled")
    time.sleep(OPT_IN_CACHE_SECONDS + 0.5)
    code, doc, _ = hook.post(payload([am_alert(namespace, "dsv3", H100, fingerprint="a2")]))
    assert (code, doc["changed"], doc["ignored"]) == (200, 1, {}), doc
    obj = resource(kubectl, namespace, "dsv3")
    assert [(r["gpuProduct"], r["toK"], r["via"]) for r in obj["status"]["rollbacks"]] == [
        (H100, 5, "alertmanager")]
