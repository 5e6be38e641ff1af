"""Numbers and times in query strings (``?since=``, ``?before=``, ``?cursor=``), read the
same way by every route: a value out of range is a 400 that says the range, never an
overflow deeper down (the database refuses integers past 64 bits; date arithmetic past
year 9999), which would be a 500."""

from __future__ import annotations

import datetime as dt

from tornado import web

#: The largest integer a stored row holds (SQLite INTEGER, PostgreSQL BIGINT).
MAX_INT = 2**63 - 1
#: Times a query may name: Unix time 0 to the end of year 9998 (a year of room on each
#: side for the arithmetic routes do with them, such as "until minus a week").
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)


def int_arg(name: str, value: str | None, default: int | None, low: int, high: int = MAX_INT):
    """``value`` as an integer from ``low`` to ``high``; ``default`` when absent or empty.
    ASCII digits only (``int()`` would also take other scripts' digits and ``1_000``)."""
    if value is None or value == "":
        return default
    text = value.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 30:
        raise web.HTTPError(400, f"{name} must be an integer, got {value[:40]!r}")
    n = int(text)
    if not low <= n <= high:
        raise web.HTTPError(400, f"{name} must be from {low} to {high}, got {value[:40]}")
    return n


def time_arg(name: str, value: str | None) -> dt.datetime | None:
    """``value`` as a UTC time: ISO 8601 (a date, or a time with or without a zone; UTC
    if none) or Unix seconds. None when absent; a 400 that says the forms otherwise (an
    empty ``since=`` too: it would silently mean the default), and one that says the
    range for a time before 1970 or after 9998."""
    if value is None:
        return None
    if not value.strip():
        raise web.HTTPError(
            400,
            f"'{name}' is empty: give an ISO 8601 time such as 2026-12-01T12:00:00Z or Unix "
            f"seconds, or leave {name}= out",
        )
    try:
        seconds = float(value)
    except ValueError:
        seconds = None
    if seconds is not None:
        try:
            parsed = dt.datetime.fromtimestamp(seconds, dt.UTC)
        except (ValueError, OverflowError, OSError):
            parsed = None  # inf, nan, 1e20: out of range, said below
    else:
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise web.HTTPError(
                400,
                f"'{name}' must be an ISO 8601 time such as 2026-12-01 or 2026-12-01T12:00:00Z, "
                f"or Unix seconds; got {value[:40]!r}",
            ) from None
        # Stored times are UTC (SQLite keeps no zone): compare in UTC.
        try:
            parsed = (
                parsed.replace(tzinfo=dt.UTC)
                if parsed.tzinfo is None
                else parsed.astimezone(dt.UTC)
            )
        except OverflowError:  # 9999-12-31T23:00-05:00 is past year 9999 in UTC
            parsed = None
    if parsed is None or not EARLIEST <= parsed < LATEST:
        raise web.HTTPError(
            400,
            f"'{name}' is out of range: give a time from 1970-01-01 to 9998-12-31 "
            f"(Unix seconds 0 to {int(LATEST.timestamp()) - 1}); got {value[:40]!r}",
        )
    return parsed
