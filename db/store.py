"""What every store of gpulab's tables shares: the engine it is given, how it reads and
writes, and the few row shapes the tables have in common.

A store is a class given the engine (``DeploymentStore(engine)``); its methods are the
queries of its tables and return plain dicts. Reads take a plain connection; every
write takes the writer's transaction (:func:`.engine.writer`: on SQLite the write lock
at BEGIN, so a read-then-write never fails half-way for another writer; on PostgreSQL
nothing more, the ledger's transactions take their advisory lock themselves).

The helpers below are the shape the tables repeat (a row by id, a user's row by
name, a user's rows in order, an update or delete by id, JSON columns written and
read); a store says which table and how its rows read, not how to query them again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from sqlalchemy import Table, delete, insert, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql import ColumnElement, Select

from .engine import writer

RowDict = Callable[[object], dict]


def plain(row) -> dict:
    """A row as a dict of its columns, as stored."""
    return dict(row._mapping)


def json_columns(
    values: dict, lists: tuple[str, ...] = (), objects: tuple[str, ...] = (), skip_none=False
) -> dict:
    """``values`` with its JSON columns encoded: ``lists`` sorted (sharing lists: the
    same members store the same), ``objects`` as given. A column absent stays absent;
    with ``skip_none`` a None stays None (NULL) instead of JSON ``null``."""
    out = dict(values)
    for k in (*lists, *objects):
        if k not in out or (skip_none and out[k] is None):
            continue
        out[k] = json.dumps(sorted(out[k] or []) if k in lists else out[k])
    return out


class Store:
    """The queries of one module's tables, given the engine (subclass it per module)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    # -- transactions ---------------------------------------------------------------
    def reading(self) -> AbstractContextManager[Connection]:
        return self.engine.connect()

    def writing(self) -> AbstractContextManager[Connection]:
        """One write transaction (see the module's docstring)."""
        return writer(self.engine).begin()

    # -- the shapes the tables share --------------------------------------------------
    def first(self, query: Select, as_dict: RowDict = plain) -> dict | None:
        with self.reading() as conn:
            r = conn.execute(query).first()
        return as_dict(r) if r else None

    def all(self, query: Select, as_dict: RowDict = plain) -> list[dict]:
        with self.reading() as conn:
            return [as_dict(r) for r in conn.execute(query)]

    def by_id(self, table: Table, key: str, as_dict: RowDict = plain) -> dict | None:
        return self.first(select(table).where(table.c.id == key), as_dict)

    def by_name(self, table: Table, user: str, name: str, as_dict: RowDict = plain) -> dict | None:
        """``user``'s row named ``name`` (tables with one name per user)."""
        return self.first(select(table).where(_named(table, user, name)), as_dict)

    def of_user(
        self, table: Table, user: str | None, order_by: Iterable, as_dict: RowDict = plain
    ) -> list[dict]:
        """``user``'s rows (everyone's: None) in ``order_by``."""
        q = select(table).order_by(*order_by)
        if user is not None:
            q = q.where(table.c.user == user)
        return self.all(q, as_dict)

    def insert_named(self, conn: Connection, table: Table, row: dict, taken: type[Exception]):
        """Insert ``row`` unless its user has a row of its name: then raise ``taken``."""
        used = conn.execute(
            select(table.c.id).where(_named(table, row["user"], row["name"]))
        ).first()
        if used:
            raise taken(row["name"])
        conn.execute(insert(table), [row])

    def update_by_id(self, table: Table, key: str, values: dict) -> int:
        """Set ``values`` on the row ``key``; how many rows changed (0 or 1)."""
        with self.writing() as conn:
            return conn.execute(update(table).where(table.c.id == key).values(**values)).rowcount

    def delete_where(self, table: Table, cond: ColumnElement) -> int:
        with self.writing() as conn:
            return conn.execute(delete(table).where(cond)).rowcount or 0


def _named(table: Table, user: str, name: str) -> ColumnElement:
    return (table.c.user == user) & (table.c.name == name)
