"""Times as Kubernetes writes them in status: RFC 3339 in UTC with a trailing Z."""

from __future__ import annotations

from datetime import UTC, datetime


def format_time(t: datetime) -> str:
    """RFC 3339 in UTC with a Z, as Kubernetes writes times."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    t = datetime.fromisoformat(s.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)
