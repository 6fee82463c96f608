"""Times as Kubernetes writes them in status: RFC 3339 in UTC with a trailing Z.

A time read back from a status may be anything a hand edit or another writer left there
(issue 36): `parse_time` reads a value that is not a usable time as absent, and
`time_problem` says why, for the caller that logs it.
"""

from __future__ import annotations

from datetime import UTC, datetime

# The times the operator writes come from its clock. Outside these bounds a value cannot be
# one of them, and near datetime's own ends (years 1 and 9999) adding or subtracting a
# duration (a cooldown, a grace period) overflows: read as absent instead.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def format_time(t: datetime) -> str:
    """RFC 3339 in UTC with a Z, as Kubernetes writes times."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(s: str) -> datetime:
    t = datetime.fromisoformat(s.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def time_problem(s: object) -> str | None:
    """Why `s` (a status field's value) is not a usable time; None when it is one or is
    unset."""
    if s is None or s == "":
        return None
    if not isinstance(s, str):
        return f"not a string but {type(s).__name__}"
    try:
        t = _parse(s)
    except (ValueError, OverflowError) as err:
        return f"not an RFC 3339 time ({err})"
    if not EARLIEST <= t < LATEST:
        return f"outside {format_time(EARLIEST)}..{format_time(LATEST)}"
    return None


def parse_time(s: str | None) -> datetime | None:
    """A status time; None when unset or not a usable time (`time_problem` says why)."""
    if not s or time_problem(s) is not None:
        return None
    return _parse(s)
