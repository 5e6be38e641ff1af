"""Migrations: databases made before them are adopted with their rows, every start
ends at head, and the models never drift from the revisions (real SQLite and
PostgreSQL)."""

import datetime as dt
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from pg import sqlalchemy_url
from sqlalchemy import (
    Column,
    Index,
    Integer,
    MetaData,
    Table,
    create_engine,
    insert,
    inspect,
    select,
    text,
)
from support.wait import wait_until

from gpulab.db import migrate
from gpulab.db.deployments import deployments, versions
from gpulab.db.engine import allocations, make_engine
from gpulab.db.jobs import jobs

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)

ROWS = {
    allocations: {
        "id": "a1",
        "user": "alice",
        "owner_kind": "server",
        "owner": "alice/",
        "node": "n1",
        "gpu_uuid": "GPU-1",
        "gpu_index": 0,
        "milli": 250,
        "memory_mib": 20480,
        "created": NOW,
    },
    jobs: {
        "id": "j1",
        "user": "alice",
        "name": "train",
        "state": "running",
        "priority": 0,
        "backend": "local",
        "nodes": 1,
        "nproc_per_node": 2,
        "gpu_milli": 500,
        "submitted": NOW,
        "started": NOW,
        "finished": None,
        "message": "running",
        "error": None,
        "restarts": 1,
    },
    deployments: {
        "id": "d1",
        "user": "bob",
        "name": "mnist",
        "state": "running",
        "replicas": 2,
        "gpu_milli": 100,
        "max_batch_size": 8,
        "max_latency_ms": 5.0,
        "max_queue": 64,
        "stop_with_server": True,
        "share_users": '["carol"]',
        "share_groups": "[]",
        "created": NOW,
        "message": "ready",
        "restarts": 0,
    },
}


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """An empty database of its own per test."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/gpulab.sqlite"
    return request.getfixturevalue("postgres_db")


def schema_diff(engine, metadata=None) -> list:
    with engine.connect() as conn:
        mc = MigrationContext.configure(
            conn, opts={"compare_type": True, "version_table": migrate.VERSION_TABLE}
        )
        return compare_metadata(mc, metadata if metadata is not None else migrate.target_metadata())


def revision_at(engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(text(f"SELECT version_num FROM {migrate.VERSION_TABLE}")).scalars()
        )


def read_rows(engine) -> dict:
    out = {}
    with engine.connect() as conn:
        for table in ROWS:
            out[table.name] = [dict(r._mapping) for r in conn.execute(select(table))]
    return out


def _same(row: dict, want: dict) -> bool:
    def norm(v):  # SQLite gives naive datetimes back; we only store UTC
        if isinstance(v, dt.datetime) and v.tzinfo is None:
            return v.replace(tzinfo=dt.UTC)
        return v

    return {k: norm(v) for k, v in row.items()} == want


#: Columns later revisions add, and the value an adopted row gets for each.
ADDED_LATER = {
    "gpulab_jobs": {
        "priority_class": "batch",
        "preemptible": True,
        "preemptions": 0,
        "preempting": None,
        "pool": None,  # a job of before pools: its backend's kind names its pool
        # A job of before elastic jobs is a fixed one.
        "min_nodes": None,
        "max_nodes": None,
        "resizes": None,
        "resizing": None,
    },
    # d1's fixed count (2) and its batch size (8) as the target.
    "gpulab_deployments": {
        "max_replicas": 2,
        "target_inflight": 8.0,
        "scale_down_delay_s": 300.0,
        "rollback_margin": None,
    },
}


def baseline_tables() -> dict[str, Table]:
    """The tables as they were before migrations (the baseline revision's shape)."""
    path = Path(migrate.__file__).parent / "migrations" / "versions" / "0001_baseline.py"
    spec = importlib.util.spec_from_file_location("gpulab_baseline", path)
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    old = MetaData()
    return {
        name: Table(name, old, *columns, *[Index(i, *cols) for i, cols in indexes])
        for name, (columns, indexes) in baseline._tables().items()
    }


def make_pre_migration_database(url: str, tables) -> None:
    """What ``metadata.create_all`` made before there were migrations, with a row each."""
    plain = create_engine(sqlalchemy_url(url))
    old = baseline_tables()
    with plain.begin() as conn:
        for table in tables:
            old[table.name].create(conn)
            conn.execute(insert(old[table.name]), [ROWS[table]])
    plain.dispose()


def as_adopted(table, row: dict) -> dict:
    return {**row, **ADDED_LATER.get(table.name, {})}


def test_database_from_before_migrations_is_adopted_with_its_rows(db_url):
    make_pre_migration_database(db_url, list(ROWS))
    engine = make_engine(db_url)
    try:
        got = read_rows(engine)
        for table, want in ROWS.items():
            assert len(got[table.name]) == 1, table.name
            assert _same(got[table.name][0], as_adopted(table, want)), table.name
        assert revision_at(engine) == [migrate.head()]
        assert schema_diff(engine) == []
        # The deployment became version 1 of itself, with every call and its count.
        with engine.connect() as conn:
            (version,) = [dict(r._mapping) for r in conn.execute(select(versions))]
        assert (version["id"], version["deployment_id"], version["version"]) == ("d1", "d1", 1)
        assert (version["weight"], version["replicas"], version["max_batch_size"]) == (100, 2, 8)
    finally:
        engine.dispose()


def test_database_missing_later_tables_gets_them(db_url):
    """A database from when only the ledger existed: its table stays, the rest appear."""
    make_pre_migration_database(db_url, [allocations])
    engine = make_engine(db_url)
    try:
        got = read_rows(engine)
        assert _same(got["gpulab_allocations"][0], ROWS[allocations])
        assert got["gpulab_jobs"] == got["gpulab_deployments"] == []
        assert revision_at(engine) == [migrate.head()]
        assert schema_diff(engine) == []
    finally:
        engine.dispose()


def test_fresh_database_is_at_head_and_matches_the_models(db_url):
    engine = make_engine(db_url)
    try:
        assert revision_at(engine) == [migrate.head()]
        # A table or column changed in the models without a revision fails here.
        assert schema_diff(engine) == []
        assert {migrate.VERSION_TABLE, *(t.name for t in ROWS)} <= set(
            inspect(engine).get_table_names()
        )
    finally:
        engine.dispose()
    again = make_engine(db_url)  # a restart: nothing to do, nothing lost
    try:
        assert revision_at(again) == [migrate.head()]
    finally:
        again.dispose()


def test_the_drift_check_sees_a_model_change(db_url):
    """The check above is not vacuous: an unmigrated column shows up as a difference."""
    engine = make_engine(db_url)
    try:
        changed = MetaData()
        for table in migrate.target_metadata().tables.values():
            table.to_metadata(changed)
        changed.tables["gpulab_jobs"].append_column(Column("new_thing", Integer))
        diff = schema_diff(engine, changed)
        assert [d[0] for d in diff] == ["add_column"]
    finally:
        engine.dispose()


def test_services_starting_together_migrate_once(db_url, tmp_path):
    """Several processes start on one empty database at once: one migrates, all run."""
    go = tmp_path / "go"
    script = textwrap.dedent(f"""
        import os, sys, time
        from gpulab.db.engine import make_engine  # imports done before the start line
        open(sys.argv[1], "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.001)
        make_engine({db_url!r}).dispose()
    """)
    ready = [tmp_path / f"ready{i}" for i in range(4)]
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(r)], stderr=subprocess.PIPE, text=True)
        for r in ready
    ]
    wait_until(
        lambda: all(r.exists() for r in ready), "the four processes to be ready", 60, every=0.01
    )
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    engine = make_engine(db_url)
    try:
        assert revision_at(engine) == [migrate.head()]
        assert schema_diff(engine) == []
    finally:
        engine.dispose()
