"""Times in query strings (``?since=``, ``?until=``), read the same way by every route."""

from __future__ import annotations

import datetime as dt

from tornado import web


def time_arg(name: str, value: str | None) -> dt.datetime | None:
    """``value`` as a UTC time: ISO 8601 (a date, or a time with or without a zone; UTC
    if none) or Unix seconds. None when absent; a 400 that says the forms otherwise (an
    empty ``since=`` too: it would silently mean the default)."""
    if value is None:
        return None
    if not value.strip():
        raise web.HTTPError(
            400,
            f"'{name}' is empty: give an ISO 8601 time such as 2026-12-01T12:00:00Z or Unix "
            f"seconds, or leave {name}= out",
        )
    try:
        return dt.datetime.fromtimestamp(float(value), dt.UTC)
    except (ValueError, OverflowError, OSError):
        pass
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise web.HTTPError(
            400,
            f"'{name}' must be an ISO 8601 time such as 2026-12-01 or 2026-12-01T12:00:00Z, "
            f"or Unix seconds; got {value!r}",
        ) from None
    # Stored times are UTC (SQLite keeps no zone): compare in UTC.
    return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
