"""Real Prometheus and Alertmanager as local processes: scraping, rule evaluation, webhook."""

from __future__ import annotations

import pytest

from monitoring import Alertmanager, MetricsServer, Prometheus, ScrapeTarget, WebhookReceiver

pytestmark = pytest.mark.usefixtures("monitoring_binaries")


def test_prometheus_scrapes_local_target():
    with (
        MetricsServer("mtp_smoke_value 42\n") as target,
        Prometheus(targets=[ScrapeTarget(target.address, {"pool": "h100"}, job="smoke")]) as prom,
    ):
        up = prom.wait_for('up{job="smoke",pool="h100"} == 1', timeout=30)
        assert up[0]["value"][1] == "1"
        val = prom.wait_for("mtp_smoke_value", timeout=30)
        assert val[0]["metric"]["pool"] == "h100"
        assert val[0]["value"][1] == "42"
        assert target.scrapes >= 1


@pytest.mark.parametrize("token_via_file", [False, True])
def test_alert_fires_and_reaches_webhook_with_bearer_token(tmp_path, token_via_file):
    token = "smoke-token-123"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    rules = {
        "groups": [
            {
                "name": "smoke",
                "rules": [
                    {
                        "alert": "MTPSmokeHigh",
                        "expr": "mtp_smoke_value > 10",
                        "for": "0s",
                        "labels": {"severity": "page"},
                        "annotations": {"summary": "value {{ $value }} on {{ $labels.pool }}"},
                    }
                ],
            }
        ]
    }
    with (
        WebhookReceiver() as hook,
        MetricsServer("mtp_smoke_value 42\n") as target,
        Alertmanager(
            hook.url + "/hook",
            **({"bearer_token_file": token_file} if token_via_file else {"bearer_token": token}),
        ) as am,
        Prometheus(
            targets=[ScrapeTarget(target.address, {"pool": "h100"})],
            rules=rules,
            alertmanager_url=am.url,
        ) as prom,
    ):
        prom.wait_for_alert("MTPSmokeHigh", "firing", timeout=30)
        req = hook.wait_for(lambda r: r.json["status"] == "firing", timeout=30)
        assert req.path == "/hook"
        assert req.authorization == f"Bearer {token}"
        body = req.json
        alert = body["alerts"][0]
        assert alert["labels"]["alertname"] == "MTPSmokeHigh"
        assert alert["labels"]["pool"] == "h100"
        assert alert["annotations"]["summary"] == "value 42 on h100"
        assert am.alerts()[0]["labels"]["alertname"] == "MTPSmokeHigh"
