"""The engine and the ledger's table: SQLite by default, PostgreSQL by URL.

Both databases serialise writers the same way: every write transaction takes a
database-wide lock first (``BEGIN IMMEDIATE`` on SQLite, a transaction-scoped
advisory lock on PostgreSQL). Two service processes sharing one database can
therefore never both see a GPU as free and both place on it.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    create_engine,
    event,
    text,
)
from sqlalchemy.engine import Connection, Engine

from . import clock

metadata = MetaData()

allocations = Table(
    "gpulab_allocations",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("user", String(255), nullable=False),
    # "server", "job" or "deployment"; ``owner`` names it ("alice/" for alice's
    # default server, a job id, a deployment name).
    Column("owner_kind", String(16), nullable=False),
    Column("owner", String(255), nullable=False),
    Column("node", String(255), nullable=False),
    Column("gpu_uuid", String(96), nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("milli", Integer, nullable=False),
    Column("memory_mib", Integer, nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
    UniqueConstraint("owner_kind", "owner", "gpu_uuid", name="one_share_per_gpu_per_owner"),
    Index("ix_allocations_user", "user"),
)

# Advisory lock key for PostgreSQL; any constant shared by all service processes.
_PG_LOCK_KEY = 0x67_70_75_6C  # "gpul"


def utcnow() -> dt.datetime:
    """Now in UTC, from gpulab's one clock (:mod:`.clock`: a test may fake it)."""
    return clock.utcnow()


def make_engine(url: str) -> Engine:
    """Create the engine and migrate the database to the newest schema (idempotent).

    Every table gpulab keeps comes with it: :mod:`.migrate` imports their modules.
    """
    if url.startswith("postgresql://"):
        # psycopg 3 is the driver we ship; the plain scheme would pick psycopg2.
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})
        _sqlite_immediate_transactions(engine)
    elif url.startswith("postgresql+psycopg://"):
        # The password never in the clear: a server that asks for it so (a process of
        # a user's that took a restarting PostgreSQL's port) is refused by libpq.
        engine = create_engine(url, pool_pre_ping=True, connect_args={"require_auth": "!password"})
    else:
        engine = create_engine(url, pool_pre_ping=True)
    from .migrate import upgrade  # here: the table modules import this one

    upgrade(engine)
    return engine


def _sqlite_immediate_transactions(engine: Engine) -> None:
    # pysqlite's own transaction handling defers BEGIN until the first write,
    # which lets two writers decide on the same free GPU; writers (see
    # ``writer``) take the write lock at BEGIN instead. Readers take a plain
    # BEGIN, and WAL keeps them off the writer's back.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=FULL")

    @event.listens_for(engine, "begin")
    def _begin(conn):
        immediate = conn.get_execution_options().get(_WRITER_OPTION)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


_WRITER_OPTION = "gpulab_writer"


def writer(engine: Engine) -> Engine:
    """The engine for write transactions: they serialise across processes."""
    return engine.execution_options(**{_WRITER_OPTION: True})


def lock_for_write(conn: Connection) -> None:
    """Serialise writers across processes (SQLite already did at BEGIN)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
