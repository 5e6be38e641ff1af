"""The schedules' table (``gpulab.db.schedules``) on real SQLite and PostgreSQL: each
user's caps hold against requests at once, and a database from before a schedule
kept its owner's creation time keeps its schedules."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from alembic import command
from sqlalchemy import create_engine, insert, select

from gpulab.db import migrate
from gpulab.db.engine import make_engine
from gpulab.db.schedules import OverLimit, ScheduleStore, schedules

NOW = dt.datetime(2026, 12, 1, 1, 0, tzinfo=dt.UTC)


def row(n: int, user: str = "alice", job: dict | None = None) -> dict:
    return {
        "id": f"s{n}",
        "user": user,
        "name": f"n{n}",
        "schedule": "0 3 * * *",
        "timezone": "UTC",
        "active": True,
        "job": job or {"code": "print(1)"},
        "meta": {},
        "created": NOW,
        "next_run": NOW,
    }


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/gpulab.sqlite"
    return request.getfixturevalue("postgres_db")


def _slow_counts(monkeypatch, store: ScheduleStore) -> None:
    """Each count waits a moment before its insert: requests at once overlap."""
    usage = ScheduleStore._usage

    def slow(self, conn, user, excluding=None):
        found = usage(self, conn, user, excluding)
        time.sleep(0.3)
        return found

    monkeypatch.setattr(ScheduleStore, "_usage", slow)


def _at_once(calls) -> list:
    results = [None] * len(calls)

    def run(i, call):
        try:
            call()
            results[i] = "ok"
        except OverLimit:
            results[i] = "over"

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_requests_at_once_cannot_pass_a_users_caps(db_url, monkeypatch):
    """On PostgreSQL the count and the insert were not one writer's at a time (SQLite's
    BEGIN IMMEDIATE made them so): parallel POSTs each counted the schedules before
    the others' inserts and all passed the cap."""
    engine = make_engine(db_url)
    try:
        store = ScheduleStore(engine)
        _slow_counts(monkeypatch, store)
        adds = [lambda n=n: store.add(row(n), max_count=1, max_bytes=1 << 20) for n in range(4)]
        assert sorted(_at_once(adds)) == ["ok", "over", "over", "over"]
        # Growing two at once past the bytes they may take together: one wins.
        store.add(row(10, "bob"), max_count=10, max_bytes=1 << 20)
        store.add(row(11, "bob"), max_count=10, max_bytes=1 << 20)
        big = {"job": {"code": "x" * 700}, "meta": {}}
        grows = [
            lambda sid=sid: store.replace(sid, "bob", big, max_bytes=1000) for sid in ("s10", "s11")
        ]
        assert sorted(_at_once(grows)) == ["ok", "over"]
        with engine.connect() as conn:
            kept = conn.execute(select(schedules.c.id).where(schedules.c.user == "alice")).all()
        assert len(kept) == 1
    finally:
        engine.dispose()


def test_schedules_made_before_owners_were_kept_stay_with_no_owner_time(tmp_path):
    url = f"sqlite:///{tmp_path}/gpulab.sqlite"
    plain = create_engine(url)
    with plain.begin() as conn:
        command.upgrade(migrate.alembic_config(conn), "0014")
        old = {k: v for k, v in row(1).items() if k not in ("job", "meta")}
        conn.execute(insert(_old_table()), [old])
    plain.dispose()
    engine = make_engine(url)
    try:
        (got,) = ScheduleStore(engine).list()
        assert (got["id"], got["owner_created"], got["job_bytes"]) == ("s1", None, 2)
    finally:
        engine.dispose()


def _old_table():
    """gpulab_schedules as revision 0013 made it (no owner_created)."""
    from sqlalchemy import Boolean, Column, DateTime, MetaData, String, Table, Text

    return Table(
        "gpulab_schedules",
        MetaData(),
        Column("id", String(32), primary_key=True),
        Column("user", String(255)),
        Column("name", String(255)),
        Column("schedule", String(255)),
        Column("timezone", String(64)),
        Column("active", Boolean),
        Column("job", Text, default="{}"),
        Column("meta", Text, default="{}"),
        Column("created", DateTime(timezone=True)),
        Column("next_run", DateTime(timezone=True)),
    )


def test_a_due_run_is_taken_once_and_only_as_it_was_read(db_url):
    """What the loop read is taken only if nothing changed it since (on both engines:
    the times compare as stored)."""
    engine = make_engine(db_url)
    try:
        store = ScheduleStore(engine)
        store.add(row(1), max_count=10, max_bytes=1 << 20)
        store.add(row(2), max_count=10, max_bytes=1 << 20)
        later = NOW + dt.timedelta(days=1)
        first, second = store.due(NOW)
        taken = store.claim(first, later, NOW)
        assert taken["next_run"] == later.isoformat() and taken["job"] == {"code": "print(1)"}
        assert store.claim(first, later, NOW) is None  # taken already
        store.update("s2", active=False)
        assert store.claim(second, later, NOW) is None  # paused meanwhile
        store.put_back("s1", later, NOW + dt.timedelta(minutes=1), "hub down")
        assert store.get("s1")["next_run"] == (NOW + dt.timedelta(minutes=1)).isoformat()
        store.put_back("s1", later, NOW, "a change meanwhile wins")  # not at `later` now
        assert store.get("s1")["last_error"] == "hub down"
    finally:
        engine.dispose()
