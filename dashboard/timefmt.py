"""Human times: every time the dashboard shows is a UTC date and clock time, never epoch ms."""

from __future__ import annotations

from datetime import UTC, datetime

#: how a time is written on the pages (``2026-11-25 08:30:00 UTC``)
FORMAT = "%Y-%m-%d %H:%M:%S UTC"


def as_utc(t: datetime | int | float) -> datetime:
    """``t`` as an aware UTC datetime: epoch milliseconds, or a datetime (naive = already UTC)."""
    if isinstance(t, datetime):
        return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return datetime.fromtimestamp(float(t) / 1000.0, UTC)


def utc_text(t: datetime | int | float | None, missing: str = "-") -> str:
    """``t`` (epoch ms or a datetime) as ``YYYY-MM-DD HH:MM:SS UTC``; ``missing`` for None."""
    return missing if t is None else as_utc(t).strftime(FORMAT)


def clock(t: datetime | int | float) -> str:
    """``t`` as ``YYYY-MM-DD HH:MM:SS`` in UTC (for fixed-width listings whose header says UTC)."""
    return as_utc(t).strftime("%Y-%m-%d %H:%M:%S")


def span_text(seconds: float) -> str:
    """A duration as a person says it: ``45 s``, ``12 min``, ``3 h 5 min``, ``2 days``."""
    s = max(0.0, float(seconds))
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        h, m = divmod(round(s / 60), 60)
        return f"{h} h" + (f" {m} min" if m else "")
    return f"{s / 86400:.0f} days"


def table_time(t: datetime | None) -> datetime | None:
    """``t`` for a table column titled ``(UTC)``: the UTC wall time without a zone, so the grid
    shows ``2026-11-25 08:30:00`` (not ``+00:00``) and sorts as time."""
    return None if t is None else as_utc(t).replace(tzinfo=None)
