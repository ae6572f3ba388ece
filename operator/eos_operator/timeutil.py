"""RFC 3339 timestamps, as the Kubernetes API writes them (UTC, seconds, trailing Z), and with milliseconds
where a second would be a wait of its own (a restart's not-before time)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone


def utc(dt: datetime) -> datetime:
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def fmt(dt: datetime) -> str:
    """Seconds precision (truncated), like metav1.Time."""
    return utc(dt).strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_ceil(dt: datetime) -> str:
    """Seconds precision rounded up: a 'not before' time never earlier than intended."""
    dt = utc(dt)
    if dt.microsecond:
        dt = dt.replace(microsecond=0) + timedelta(seconds=1)
    return fmt(dt)


def fmt_ms_ceil(dt: datetime) -> str:
    """Milliseconds precision rounded up: a 'not before' time never earlier than intended, and not up to a
    second later either (a restart waits for it: seconds precision would add up to a second to every
    recovery). ``parse`` reads it as it reads the seconds form an older operator wrote."""
    dt = utc(dt)
    if dt.microsecond % 1000:
        dt += timedelta(microseconds=1000 - dt.microsecond % 1000)
    return f"{dt.strftime('%Y-%m-%dT%H:%M:%S')}.{dt.microsecond // 1000:03d}Z"


def parse(value: str | None) -> datetime | None:
    if not value:
        return None
    return utc(datetime.fromisoformat(value.replace("Z", "+00:00")))


def seconds_between(earlier: datetime, later: datetime) -> float:
    return (utc(later) - utc(earlier)).total_seconds()
