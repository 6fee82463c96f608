"""Alertmanager webhook payloads (version 4) → AlertSignals. Pure: bytes in, signals out.

An alert names its pool with the labels `namespace`, `mtpinference`, `gpu_product` (and, for
a traffic class pool, `traffic_class`: the pool `product/class`), its kind with `alertname`.
Its value is the annotation `value` (the shipped rules set it to `{{ $value }}`), else a
label `value`; the threshold likewise (`threshold`). A value that is
missing or not a number is "no data", which the policy never acts on; a firing alert whose
value is NaN, infinite or outside [0, 1] (no hit rate or error-propagation rate can be) is
ignored and counted (`impossible_value`).

Only MTPHitRateLow and MTPErrorPropagationHigh become signals; every other alert, and one of
ours without the target labels, is accepted and ignored (counted by reason), so Alertmanager
does not retry a notification that can never succeed.

Given the time (`now`, from the caller: this module has no clock) and `max_age`, old alerts
are ignored too (`alert_age_reason`): a firing alert that began more than `max_age` ago
(`stale`) or whose `endsAt` is already past (`already_ended`: Alertmanager shows no end
before it is reached, so such an alert is over), and a resolved one that ended more than
`max_age` ago (`stale`). A body with more than `max_alerts` alerts is refused whole
(`TooManyAlerts`) before any alert is read.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..naming import pool_key
from .signals import (
    CLASS_LABEL,
    POOL_LABELS,
    ROLLBACK_ALERTS,
    TARGET_LABELS,
    AlertSignal,
    PoolRef,
)

# Alertmanager writes this for "no end yet".
_ZERO_TIME_YEAR = 1


class PayloadError(ValueError):
    """The body is not a webhook payload we can read; the message says why."""


class TooManyAlerts(PayloadError):
    """The body carries more alerts than the receiver takes in one request."""

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(
            f"body has {count} alerts, over the limit of {limit} a request; set "
            f"`max_alerts: {limit}` (or less) in Alertmanager's webhook_config, or group the "
            f"route by pool (group_by: [{', '.join(POOL_LABELS)}, alertname])"
        )
        self.count, self.limit = count, limit


class _Alert(BaseModel):
    model_config = ConfigDict(extra="ignore")
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    startsAt: str | None = None
    endsAt: str | None = None
    fingerprint: str | None = None


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: str | None = None
    alerts: list[_Alert]


@dataclass
class ParsedWebhook:
    signals: list[AlertSignal] = field(default_factory=list)
    ignored: Counter[str] = field(default_factory=Counter)  # reason → alerts
    received: int = 0


def _time(s: str | None) -> datetime | None:
    if not s:
        return None
    try:
        t = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.year <= _ZERO_TIME_YEAR:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _number(alert: _Alert, key: str) -> float | None:
    raw = alert.annotations.get(key, alert.labels.get(key))
    if raw is None:
        return None
    try:
        return float(raw.strip())
    except ValueError:
        return None


def _validation_message(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"not an Alertmanager webhook payload: {where}: {first['msg']}{more}"


def alert_age_reason(
    status: str,
    starts_at: datetime | None,
    ends_at: datetime | None,
    now: datetime,
    max_age: timedelta,
) -> str | None:
    """Why an alert is too old to act on (`stale`, `already_ended`), or None. An alert with
    no times says nothing about its age and is kept (Alertmanager always sends startsAt)."""
    oldest = now - max_age
    if status == "firing":
        if ends_at is not None and ends_at <= now:
            return "already_ended"
        if starts_at is not None and starts_at < oldest:
            return "stale"
        return None
    last = ends_at or starts_at
    return "stale" if last is not None and last < oldest else None


def parse_webhook(
    body: bytes,
    *,
    max_alerts: int | None = None,
    now: datetime | None = None,
    max_age: timedelta | None = None,
) -> ParsedWebhook:
    """Parse one webhook POST body. Raises PayloadError for bad JSON or a wrong schema,
    TooManyAlerts for more than `max_alerts` alerts. With `now` and `max_age`, old alerts
    are ignored (module doc)."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise PayloadError("malformed JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise PayloadError("not an Alertmanager webhook payload: expected a JSON object")
    alerts = doc.get("alerts")
    if max_alerts is not None and isinstance(alerts, list) and len(alerts) > max_alerts:
        raise TooManyAlerts(len(alerts), max_alerts)
    try:
        payload = _Payload.model_validate(doc)
    except ValidationError as exc:
        raise PayloadError(_validation_message(exc)) from None
    if payload.version not in (None, "4"):
        raise PayloadError(f"unsupported webhook version {payload.version!r} (expected '4')")

    out = ParsedWebhook(received=len(payload.alerts))
    for alert in payload.alerts:
        name = alert.labels.get("alertname", "")
        if name not in ROLLBACK_ALERTS:
            out.ignored["not_rollback_alert"] += 1
            continue
        target = [alert.labels.get(label, "") for label in TARGET_LABELS]
        if not all(target):
            out.ignored["missing_labels"] += 1
            continue
        # a class pool's key; an empty class label is Prometheus's way of having none
        target[2] = pool_key(target[2], alert.labels.get(CLASS_LABEL) or None)
        value = _number(alert, "value")
        if alert.status == "firing" and value is not None and not 0.0 <= value <= 1.0:
            # NaN, ±Inf or a ratio outside [0, 1]: no figure the rules can produce
            out.ignored["impossible_value"] += 1
            continue
        starts_at, ends_at = _time(alert.startsAt), _time(alert.endsAt)
        if now is not None and max_age is not None:
            too_old = alert_age_reason(alert.status, starts_at, ends_at, now, max_age)
            if too_old:
                out.ignored[too_old] += 1
                continue
        out.signals.append(
            AlertSignal(
                alert=name,
                status=alert.status,
                target=PoolRef(*target),
                value=value,
                threshold=_number(alert, "threshold"),
                via="alertmanager",
                starts_at=starts_at,
                ends_at=ends_at,
                fingerprint=alert.fingerprint,
                labels=alert.labels,
            )
        )
    return out


def dedupe_key(signal: AlertSignal) -> tuple[object, ...]:
    """Identity of one notification of one alert: the same key twice is a duplicate."""
    ident = signal.fingerprint or (signal.alert, signal.target)
    return (ident, signal.status, signal.starts_at)
