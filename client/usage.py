"""GPU-hours accounting through the service (``GET /usage``): what the dashboard's Usage tab shows.

A mixin of :class:`~.base.AsyncClient`; the sync :class:`~.base.Client` has the
same method, blocking::

    gl.usage()                                  # last 7 days, by user
    gl.usage(group_by="kind")                   # server / job / deployment
    gl.usage(since="2026-11-01T00:00:00+00:00", until=datetime.now(timezone.utc))
    gl.usage(bucket="day")                      # one row per UTC day and user
    gl.usage(format="csv")                      # the same rows as CSV text

Admins get every user's rows, a user only their own.
"""

from __future__ import annotations

from datetime import datetime


def iso(when: datetime | str | None) -> str | None:
    """A time for the query string: ISO 8601 text as given; a datetime with its offset.

    A naive datetime is local time (Python's meaning), sent with the local offset.
    """
    if when is None or isinstance(when, str):
        return when
    if when.tzinfo is None:
        when = when.astimezone()
    return when.isoformat()


class UsageAPI:
    async def usage(
        self,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        group_by: str = "user",
        format: str = "json",
        bucket: str | None = None,
    ) -> dict | str:
        """GPU-hours used between ``since`` and ``until``, grouped by ``"user"``, ``"group"``
        or ``"kind"`` (``server``, ``job``, ``deployment``).

        ``until`` defaults to now and ``since`` to 7 days before ``until`` (the
        service decides both). Answer::

            {"since": "...", "until": "...", "group_by": "user",
             "rows": [{"user": "alice", "gpu_hours": 1.25,
                       "milli_gpu_seconds": 4500000, "allocations": 3}]}

        Each row's key is named after ``group_by``; rows come most GPU-hours
        first. ``bucket="day"`` cuts the window per UTC calendar day: each row
        also has ``"day": "2026-11-30"``, rows come day by day. ``format="csv"``
        returns the service's CSV text instead (a header line, then the rows,
        ``day`` first when bucketed). A service older than usage accounting
        answers 404 (:class:`~.errors.NotFound`).
        """
        query = {"since": iso(since), "until": iso(until), "group_by": group_by, "bucket": bucket}
        if format == "csv":
            data = await self.read_bytes("/usage", query={**query, "format": "csv"})
            return data.decode("utf-8")
        if format != "json":
            raise ValueError(f"format must be json or csv, got {format!r}")
        return await self.request("GET", "/usage", query=query)
