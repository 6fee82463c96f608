"""Alertmanager webhook payloads (version 4) → AlertSignals. Pure: bytes in, signals out.

An alert names its pool with the labels `namespace`, `mtpinference`, `gpu_product` and its
kind with `alertname`. Its value is the annotation `value` (the shipped rules set it to
`{{ $value }}`), else a label `value`; the threshold likewise (`threshold`). A value that is
missing or not a number is "no data", which the policy never acts on.

Only MTPHitRateLow and MTPErrorPropagationHigh become signals; every other alert, and one of
ours without the target labels, is accepted and ignored (counted by reason), so Alertmanager
does not retry a notification that can never succeed.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from .signals import ROLLBACK_ALERTS, TARGET_LABELS, AlertSignal, PoolRef

# Alertmanager writes this for "no end yet".
_ZERO_TIME_YEAR = 1


class PayloadError(ValueError):
    """The body is not a webhook payload we can read; the message says why."""


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


def parse_webhook(body: bytes) -> ParsedWebhook:
    """Parse one webhook POST body. Raises PayloadError for bad JSON or a wrong schema."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"malformed JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise PayloadError("not an Alertmanager webhook payload: expected a JSON object")
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
        out.signals.append(
            AlertSignal(
                alert=name,
                status=alert.status,
                target=PoolRef(*target),
                value=_number(alert, "value"),
                threshold=_number(alert, "threshold"),
                via="alertmanager",
                starts_at=_time(alert.startsAt),
                ends_at=_time(alert.endsAt),
                fingerprint=alert.fingerprint,
            )
        )
    return out


def dedupe_key(signal: AlertSignal) -> tuple[object, ...]:
    """Identity of one notification of one alert: the same key twice is a duplicate."""
    ident = signal.fingerprint or (signal.alert, signal.target)
    return (ident, signal.status, signal.starts_at)
