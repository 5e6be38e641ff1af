"""The usage table and its queries: GPU time used, in milli-GPU-seconds per user,
group, kind and pool, and decayed usage.

Two sources, never overlapping: released slices (this table, one row per released
slice, written in the transaction that releases it) and slices still held (the
allocations table, counted from ``created`` to now). The total never drops or
double counts across a crash or restart: a held slice's ``created`` is on disk,
and its release writes its row.

``decayed`` weighs past use by a half-life, the way KAI-Scheduler and Slurm's
fair share do: a GPU-hour a half-life ago counts as half an hour now. The queue
orders users of one class by it, least first.

A change to the table needs a revision in ``migrations/versions`` (see :mod:`.migrate`).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from sqlalchemy import BigInteger, Column, DateTime, Index, Integer, String, Table, func, select

from . import clock
from .engine import allocations, metadata
from .store import Store

usage = Table(
    "gpulab_usage",
    metadata,
    Column("id", String(32), primary_key=True),  # the allocation's id
    Column("user", String(255), nullable=False),
    Column("owner_kind", String(16), nullable=False),
    Column("owner", String(255), nullable=False),
    Column("gpu_uuid", String(96), nullable=False),
    Column("milli", Integer, nullable=False),
    Column("started", DateTime(timezone=True), nullable=False),
    Column("ended", DateTime(timezone=True), nullable=False),
    # milli x seconds held, so totals are one SUM (the metrics counter)
    Column("milli_seconds", BigInteger, nullable=False),
    Index("ix_usage_ended", "ended"),
    Index("ix_usage_user", "user"),
)

GROUP_BYS = ("user", "group", "kind", "pool")
#: How ``report`` may cut the window: ``"day"``, per UTC calendar day.
BUCKETS = ("day",)
#: Usage older than this many half-lives weighs under 0.1 %: not read.
HALF_LIVES_READ = 10


def _utc(t: dt.datetime) -> dt.datetime:
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t  # SQLite drops the zone


class UsageStore(Store):
    """GPU time used, read from the usage and allocations tables (written by the
    ledger's :class:`~.ledger.LedgerStore`)."""

    def spans(
        self, since: dt.datetime, until: dt.datetime, users: Iterable[str] | None = None
    ) -> list[dict]:
        """Every stretch a slice was held that overlaps ``[since, until)``, of ``users``
        where given (selected in SQL: a user's report reads no one else's rows).

        ``{"id", "user", "kind", "gpu_uuid", "milli", "start", "end"}``, clipped to the window;
        held slices end at ``min(now, until)``.
        """
        now = clock.utcnow()
        out = []
        closed_q = select(usage).where((usage.c.ended > since) & (usage.c.started < until))
        held_q = select(allocations).where(allocations.c.created < until)
        if users is not None:
            wanted = sorted(set(users))
            closed_q = closed_q.where(usage.c.user.in_(wanted))
            held_q = held_q.where(allocations.c.user.in_(wanted))
        with self.reading() as conn:
            closed = conn.execute(closed_q).all()
            held = conn.execute(held_q).all()
        for r in closed:
            out.append(
                (r.id, r.user, r.owner_kind, r.gpu_uuid, r.milli, _utc(r.started), _utc(r.ended))
            )
        for r in held:
            out.append((r.id, r.user, r.owner_kind, r.gpu_uuid, r.milli, _utc(r.created), now))
        clipped = []
        for rid, user, kind, gpu, milli, start, end in out:
            start, end = max(start, since), min(end, until)
            if end > start:
                clipped.append(
                    {
                        "id": rid,
                        "user": user,
                        "kind": kind,
                        "gpu_uuid": gpu,
                        "milli": milli,
                        "start": start,
                        "end": end,
                    }
                )
        return clipped

    def report(
        self,
        since: dt.datetime,
        until: dt.datetime,
        group_by: str = "user",
        users: Iterable[str] | None = None,
        groups_of: Mapping[str, Iterable[str]] | None = None,
        bucket: str | None = None,
        pool_of: Mapping[str, str] | None = None,
    ) -> list[dict]:
        """Rows ``{<group_by>, "milli_gpu_seconds", "gpu_hours", "allocations"}``, most first.

        ``users`` limits the report to those users (None: everyone). ``groups_of``
        maps a user to their groups, for ``group_by="group"``; a user in two
        groups counts in both, and one in none under ``""``. ``pool_of`` maps a GPU's UUID
        to its pool, for ``group_by="pool"``; a GPU no pool lists now counts under ``""``.

        ``bucket="day"`` cuts every span at UTC midnight: each row then also has
        ``"day"`` (``"2026-11-30"``), rows come day by day, most first within a
        day, and a slice held across midnight counts in both days' ``allocations``.
        """
        if group_by not in GROUP_BYS:
            raise ValueError(f"group_by must be one of {', '.join(GROUP_BYS)}, got {group_by!r}")
        if bucket is not None and bucket not in BUCKETS:
            raise ValueError(f"bucket must be one of {', '.join(BUCKETS)}, got {bucket!r}")
        totals: dict[tuple[str, str], float] = defaultdict(float)
        counts: dict[tuple[str, str], set[str]] = defaultdict(set)
        for s in self.spans(since, until, users):
            if group_by == "user":
                keys = [s["user"]]
            elif group_by == "kind":
                keys = [s["kind"]]
            elif group_by == "pool":
                keys = [(pool_of or {}).get(s["gpu_uuid"], "")]
            else:
                keys = sorted((groups_of or {}).get(s["user"], ())) or [""]
            pieces = _days(s["start"], s["end"]) if bucket else [("", s["start"], s["end"])]
            for day, start, end in pieces:
                amount = s["milli"] * (end - start).total_seconds()
                for k in keys:
                    totals[(day, k)] += amount
                    counts[(day, k)].add(s["id"])
        rows = [
            {
                **({"day": day} if bucket else {}),
                group_by: k,
                "milli_gpu_seconds": round(v),
                "gpu_hours": round(v / 1000 / 3600, 6),
                "allocations": len(counts[(day, k)]),
            }
            for (day, k), v in totals.items()
        ]
        return sorted(rows, key=lambda r: (r.get("day", ""), -r["milli_gpu_seconds"], r[group_by]))

    def totals(self) -> dict[tuple[str, str], float]:
        """All-time milli-GPU-seconds per ``(user, kind)``: the metrics counter."""
        now = clock.utcnow()
        out: dict[tuple[str, str], float] = defaultdict(float)
        with self.reading() as conn:
            for user, kind, ms in conn.execute(
                select(usage.c.user, usage.c.owner_kind, func.sum(usage.c.milli_seconds)).group_by(
                    usage.c.user, usage.c.owner_kind
                )
            ):
                out[(user, kind)] += float(ms or 0)
            for r in conn.execute(select(allocations)):
                out[(r.user, r.owner_kind)] += r.milli * max(
                    0.0, (now - _utc(r.created)).total_seconds()
                )
        return dict(out)

    def decayed(self, half_life_s: float, now: dt.datetime | None = None) -> dict[str, float]:
        """Milli-GPU-seconds per user, each second weighed by ``0.5 ** (age / half_life)``.

        The integral of the weight over each span, so a long span counts fairly
        however it is cut.
        """
        now = now or clock.utcnow()
        since = now - dt.timedelta(seconds=half_life_s * HALF_LIVES_READ)
        k = math.log(2) / half_life_s
        out: dict[str, float] = defaultdict(float)
        for s in self.spans(since, now):
            age_end = (now - s["end"]).total_seconds()
            age_start = (now - s["start"]).total_seconds()
            out[s["user"]] += s["milli"] * (math.exp(-k * age_end) - math.exp(-k * age_start)) / k
        return dict(out)


def _days(start: dt.datetime, end: dt.datetime) -> list[tuple[str, dt.datetime, dt.datetime]]:
    """``[start, end)`` cut at UTC midnights: ``(day, piece_start, piece_end)``."""
    out = []
    start, end = start.astimezone(dt.UTC), end.astimezone(dt.UTC)
    while start < end:
        midnight = dt.datetime.combine(start.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
        piece_end = min(end, midnight)
        out.append((start.date().isoformat(), start, piece_end))
        start = piece_end
    return out


def closed_row(row: Mapping, ended: dt.datetime) -> dict:
    """The usage row of an allocation row released at ``ended``."""
    started = _utc(row["created"])
    seconds = max(0.0, (ended - started).total_seconds())
    return {
        "id": row["id"],
        "user": row["user"],
        "owner_kind": row["owner_kind"],
        "owner": row["owner"],
        "gpu_uuid": row["gpu_uuid"],
        "milli": row["milli"],
        "started": started,
        "ended": ended,
        "milli_seconds": round(row["milli"] * seconds),
    }
