"""Bring a database's schema to the newest revision (Alembic, run in-process).

:func:`upgrade` is what :func:`.engine.make_engine` calls on every start; no
``alembic.ini`` is needed. The revisions live in ``migrations/versions``; the
first one, ``0001``, is the schema ``metadata.create_all`` made before there
were migrations, so a database from then is adopted (its tables kept, its rows
untouched) and carried on from there.

Two service processes starting at once on one database must not both migrate:
the migration runs inside one write transaction that holds the same lock every
ledger write takes (``BEGIN IMMEDIATE`` on SQLite, the advisory lock on
PostgreSQL, whose DDL is transactional too). The second process waits, then
finds the schema at head and does nothing.

A new table or column: change the ``Table`` in its module, then write the
revision with ``python -m gpulab.db.migrate revision -m "what changed"`` (from a
source checkout; it autogenerates against a scratch database at head) and read
what it wrote. ``tests/db/test_migrations.py`` fails while models and
migrations disagree.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, inspect, text
from sqlalchemy.engine import Connection, Engine

# Each registers its table on metadata.
from . import (  # noqa: F401
    collections,
    deployments,
    fine_tuning,
    hibernations,
    jobs,
    llm_usage,
    operations,
    schedules,
    usage,
)
from .engine import lock_for_write, metadata, writer

log = logging.getLogger("gpulab.db")

MIGRATIONS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "migrations")

# Not Alembic's default "alembic_version": gpulab's tables may share a
# PostgreSQL database with JupyterHub's, and the hub keeps its own revision there.
VERSION_TABLE = "gpulab_alembic_version"

BASELINE = "0001"


def target_metadata() -> MetaData:
    """Every table gpulab keeps (the modules that define them are imported above)."""
    return metadata


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS_DIR.replace("%", "%%"))
    cfg.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current(conn: Connection) -> str | None:
    """The revision the database is at; None before the first migration."""
    # Read directly: a MigrationContext would log its setup on every start.
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def upgrade(engine: Engine) -> None:
    """Migrate the database to head; a no-op (and no write lock) when it is there."""
    target = head()
    with engine.connect() as conn:
        if current(conn) == target:
            return
    with writer(engine).begin() as conn:
        lock_for_write(conn)
        found = current(conn)  # again, under the lock: another process may have done it
        if found == target:
            return
        if found is None:
            legacy = sorted(set(inspect(conn).get_table_names()) & set(metadata.tables))
            if legacy:
                log.info(
                    "Adopting gpulab tables made before migrations (%s) as revision %s",
                    ", ".join(legacy),
                    BASELINE,
                )
        log.info("Migrating gpulab's database from %s to %s", found or "nothing", target)
        command.upgrade(alembic_config(conn), "head")


def _new_revision(message: str) -> None:
    """Autogenerate the next revision against a scratch SQLite database at head."""
    from .engine import make_engine

    script = ScriptDirectory.from_config(alembic_config())
    rev_id = f"{len(list(script.walk_revisions())) + 1:04d}"
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{tmp}/scratch.sqlite")
        with engine.begin() as conn:
            command.revision(
                alembic_config(conn), message=message, autogenerate=True, rev_id=rev_id
            )
        engine.dispose()


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gpulab.db.migrate", description="gpulab's database migrations"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    rev = sub.add_parser("revision", help="write the next revision from the models' changes")
    rev.add_argument("-m", "--message", required=True)
    up = sub.add_parser(
        "upgrade", help="migrate a database to head (the service does this itself on start)"
    )
    up.add_argument("url", help="e.g. sqlite:////srv/gpulab/gpulab.sqlite or postgresql://...")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "revision":
        _new_revision(args.message)
    else:
        from .engine import make_engine

        make_engine(args.url).dispose()
        print(f"at {head()}", file=sys.stderr)


if __name__ == "__main__":
    main()
