"""Prometheus and Alertmanager as plain local processes, for tests.

The binaries come from Debian (``tests/sandbox/install_monitoring.sh``): /usr/bin/prometheus
(2.42) and /usr/bin/prometheus-alertmanager (0.25). Each instance gets a generated config, a
free loopback port and a temporary storage dir, and is stopped (process group) by ``stop()``.

Typical use::

    from monitoring import Alertmanager, MetricsServer, Prometheus, ScrapeTarget, WebhookReceiver

    with WebhookReceiver() as hook, MetricsServer("my_metric 1\\n") as target, \\
         Alertmanager(hook.url, bearer_token="s3cret") as am, \\
         Prometheus(targets=[ScrapeTarget(target.address, {"pool": "h100"})],
                    rules={"groups": [...]}, alertmanager_url=am.url) as prom:
        prom.wait_for("up == 1")
        hook.wait_for(lambda r: r.json["status"] == "firing")

Everything here is standard library plus PyYAML.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sandbox_lib.http_fakes import MetricsServer, WebhookReceiver, WebhookRequest
from sandbox_lib.monitor_process import (
    ALERTMANAGER_BIN,
    PROMETHEUS_BIN,
    PROMTOOL_BIN,
    MonitoringError,
    _get,
    _Process,
    _wait,
    binaries_present,
    free_port,
)

__all__ = [
    "ALERTMANAGER_BIN",
    "PROMETHEUS_BIN",
    "PROMTOOL_BIN",
    "Alertmanager",
    "MetricsServer",
    "MonitoringError",
    "Prometheus",
    "ScrapeTarget",
    "WebhookReceiver",
    "WebhookRequest",
    "binaries_present",
    "free_port",
    "promtool",
]


@dataclass
class ScrapeTarget:
    """One static scrape target. `address` is host:port; `labels` are attached to its series."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)
    job: str = "test"
    metrics_path: str = "/metrics"
    scheme: str = "http"


class Prometheus(_Process):
    """Prometheus with a generated prometheus.yml.

    targets: scrape targets (grouped into one scrape job per `job`/path/scheme).
    rule_files: existing rule files (paths); rules: rule groups as a dict
        (``{"groups": [...]}``) or YAML text, written to <workdir>/rules.yml.
    alertmanager_url: where firing alerts go (e.g. ``Alertmanager.url``).
    scrape_interval / evaluation_interval: Prometheus durations, "1s" by default.
    external_labels: added to every series and alert.
    """

    name = "prometheus"
    binary = PROMETHEUS_BIN

    def __init__(
        self,
        targets: Sequence[ScrapeTarget] = (),
        *,
        rule_files: Sequence[str | os.PathLike[str]] = (),
        rules: Mapping[str, Any] | str | None = None,
        alertmanager_url: str | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        scrape_timeout: str | None = None,
        external_labels: Mapping[str, str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        keep_workdir: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(
            workdir=workdir, port=port, keep_workdir=keep_workdir, extra_args=extra_args
        )
        self.targets = list(targets)
        self.rule_files = [str(Path(p).resolve()) for p in rule_files]
        self.rules = rules
        self.alertmanager_url = alertmanager_url
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.scrape_timeout = scrape_timeout
        self.external_labels = dict(external_labels or {})

    @property
    def config_file(self) -> Path:
        return self.workdir / "prometheus.yml"

    def config(self) -> dict[str, Any]:
        """The prometheus.yml content as a dict."""
        glob: dict[str, Any] = {
            "scrape_interval": self.scrape_interval,
            "evaluation_interval": self.evaluation_interval,
        }
        if self.scrape_timeout:
            glob["scrape_timeout"] = self.scrape_timeout
        if self.external_labels:
            glob["external_labels"] = self.external_labels
        jobs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for t in self.targets:
            jobs.setdefault((t.job, t.metrics_path, t.scheme), []).append(
                {"targets": [t.address], "labels": dict(t.labels)}
            )
        cfg: dict[str, Any] = {
            "global": glob,
            "scrape_configs": [
                {"job_name": job, "metrics_path": path, "scheme": scheme, "static_configs": sc}
                for (job, path, scheme), sc in jobs.items()
            ],
        }
        files = list(self.rule_files)
        if self.rules is not None:
            files.append(str(self.workdir / "rules.yml"))
        if files:
            cfg["rule_files"] = files
        if self.alertmanager_url:
            u = urllib.parse.urlsplit(self.alertmanager_url)
            am: dict[str, Any] = {
                "scheme": u.scheme or "http",
                "static_configs": [{"targets": [u.netloc]}],
                "api_version": "v2",
            }
            if u.path and u.path != "/":
                am["path_prefix"] = u.path
            cfg["alerting"] = {"alertmanagers": [am]}
        return cfg

    def _write_config(self) -> None:
        if self.rules is not None:
            text = self.rules if isinstance(self.rules, str) else yaml.safe_dump(dict(self.rules))
            (self.workdir / "rules.yml").write_text(text)
        self.config_file.write_text(yaml.safe_dump(self.config(), sort_keys=False))

    def _args(self) -> list[str]:
        return [
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={self.address}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=2h",
            "--log.level=warn",
        ]

    # -- HTTP API -------------------------------------------------------------------------

    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/<path>; returns the `data` field (raises on status != success)."""
        q = urllib.parse.urlencode(params)
        code, body = _get(f"{self.url}/api/v1/{path}" + (f"?{q}" if q else ""), 10)
        doc = json.loads(body)
        if code != 200 or doc.get("status") != "success":
            raise MonitoringError(f"prometheus {path}: HTTP {code}: {doc}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the result vector (each item has `metric` and `value`)."""
        return self.api("query", query=expr)["result"]

    def wait_for(self, expr: str, timeout: float = 30) -> list[dict[str, Any]]:
        """Waits until the instant query `expr` returns a non-empty result; returns it."""
        return _wait(lambda: self.query(expr), timeout, f"prometheus query {expr!r}")

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing) as GET /api/v1/alerts reports them."""
        return self.api("alerts")["alerts"]

    def wait_for_alert(
        self, alertname: str, state: str = "firing", timeout: float = 30
    ) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            return next(
                (
                    a
                    for a in self.alerts()
                    if a["labels"].get("alertname") == alertname and a["state"] == state
                ),
                None,
            )

        return _wait(find, timeout, f"alert {alertname} {state}")

    def targets_health(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]

    def rule_groups(self) -> list[dict[str, Any]]:
        return self.api("rules")["groups"]


class Alertmanager(_Process):
    """Alertmanager routing every alert to one webhook.

    webhook_url: the receiver (e.g. the operator's rollback endpoint or a WebhookReceiver).
    bearer_token / bearer_token_file: sent as ``Authorization: Bearer ...`` through
        ``http_config.authorization.credentials`` / ``credentials_file``.
    group_wait / group_interval / repeat_interval: route timings (short defaults for tests).
    group_by: route grouping labels (default ["alertname"]).
    send_resolved: also notify when alerts resolve.
    """

    name = "alertmanager"
    binary = ALERTMANAGER_BIN

    def __init__(
        self,
        webhook_url: str,
        *,
        bearer_token: str | None = None,
        bearer_token_file: str | os.PathLike[str] | None = None,
        group_wait: str = "1s",
        group_interval: str = "1s",
        repeat_interval: str = "1h",
        resolve_timeout: str = "5m",
        group_by: Sequence[str] = ("alertname",),
        send_resolved: bool = True,
        max_alerts: int = 0,
        workdir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        keep_workdir: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(
            workdir=workdir, port=port, keep_workdir=keep_workdir, extra_args=extra_args
        )
        if bearer_token and bearer_token_file:
            raise ValueError("give bearer_token or bearer_token_file, not both")
        self.webhook_url = webhook_url
        self.bearer_token = bearer_token
        self.bearer_token_file = (
            str(Path(bearer_token_file).resolve()) if bearer_token_file else None
        )
        self.group_wait = group_wait
        self.group_interval = group_interval
        self.repeat_interval = repeat_interval
        self.resolve_timeout = resolve_timeout
        self.group_by = list(group_by)
        self.send_resolved = send_resolved
        self.max_alerts = max_alerts

    @property
    def config_file(self) -> Path:
        return self.workdir / "alertmanager.yml"

    def config(self) -> dict[str, Any]:
        """The alertmanager.yml content as a dict."""
        hook: dict[str, Any] = {"url": self.webhook_url, "send_resolved": self.send_resolved}
        if self.max_alerts:
            hook["max_alerts"] = self.max_alerts
        if self.bearer_token or self.bearer_token_file:
            auth: dict[str, Any] = {"type": "Bearer"}
            if self.bearer_token_file:
                auth["credentials_file"] = self.bearer_token_file
            else:
                auth["credentials"] = self.bearer_token
            hook["http_config"] = {"authorization": auth}
        return {
            "global": {"resolve_timeout": self.resolve_timeout},
            "route": {
                "receiver": "webhook",
                "group_by": self.group_by,
                "group_wait": self.group_wait,
                "group_interval": self.group_interval,
                "repeat_interval": self.repeat_interval,
            },
            "receivers": [{"name": "webhook", "webhook_configs": [hook]}],
        }

    def _write_config(self) -> None:
        self.config_file.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.config_file.chmod(0o600)

    def _args(self) -> list[str]:
        return [
            f"--config.file={self.config_file}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address={self.address}",
            "--cluster.listen-address=",  # no gossip port
            "--log.level=warn",
        ]

    def alerts(self) -> list[dict[str, Any]]:
        """GET /api/v2/alerts."""
        code, body = _get(self.url + "/api/v2/alerts")
        if code != 200:
            raise MonitoringError(f"alertmanager alerts: HTTP {code}: {body!r}")
        return json.loads(body)

    def post_alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """POST /api/v2/alerts, bypassing Prometheus (each: labels, annotations, startsAt...)."""
        req = urllib.request.Request(
            self.url + "/api/v2/alerts",
            data=json.dumps(list(alerts)).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status != 200:
                raise MonitoringError(f"alertmanager post alerts: HTTP {r.status}")


def promtool(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs promtool, e.g. ``promtool("check", "rules", path)``, ``promtool("test", "rules", f)``.

    Raises MonitoringError with its output on a non-zero exit unless check=False."""
    p = subprocess.run([PROMTOOL_BIN, *args], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise MonitoringError(f"promtool {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}")
    return p
