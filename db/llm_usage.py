"""Tokens used through the OpenAI-compatible gateway: one row per answered call.

Who called (``user``), which endpoint (``owner``/``endpoint``), version and LoRA
adapter (``adapter``, '' for the base model) answered, and the prompt and completion
tokens the replica counted. :meth:`TokenUsageStore.report` sums them per
user, model and version over a window (``GET /usage?unit=tokens``).

A change to the table needs a revision in ``migrations/versions`` (see :mod:`.migrate`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from sqlalchemy import Column, DateTime, Index, Integer, String, Table, func, select

from . import clock
from .engine import metadata
from .store import Store

llm_usage = Table(
    "gpulab_llm_usage",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("user", String(255), nullable=False),  # who called
    Column("owner", String(255), nullable=False),  # whose endpoint answered
    Column("endpoint", String(63), nullable=False),
    Column("version", Integer, nullable=False),
    Column("adapter", String(63), nullable=False, server_default=""),  # '' = the base
    Column("prompt_tokens", Integer, nullable=False),
    Column("completion_tokens", Integer, nullable=False),
    Index("ix_llm_usage_at", "at"),
    Index("ix_llm_usage_user", "user"),
)


#: A report row's fields, in order (the CSV's columns).
COLUMNS = (
    "user",
    "model",
    "version",
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
)


class TokenUsageStore(Store):
    """The gateway's token rows: one written per answered call, summed for reports."""

    def record(
        self,
        user: str,
        owner: str,
        endpoint: str,
        version: int,
        prompt_tokens: int,
        completion_tokens: int,
        adapter: str = "",
    ) -> None:
        with self.writing() as conn:
            conn.execute(
                llm_usage.insert().values(
                    at=clock.utcnow(),
                    user=user,
                    owner=owner,
                    endpoint=endpoint,
                    version=version,
                    adapter=adapter,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                )
            )

    def record_many(self, rows: list[dict]) -> None:
        """Rows as :meth:`record` writes them, each with its own ``at``, in one
        transaction."""
        if rows:
            with self.writing() as conn:
                conn.execute(llm_usage.insert(), rows)

    def report(
        self, since: dt.datetime, until: dt.datetime, users: Iterable[str] | None = None
    ) -> list[dict]:
        """Per user, model (``owner/endpoint``, ``owner/endpoint:adapter`` for a LoRA
        adapter) and version: the calls and their tokens in
        ``[since, until)``; ``users`` None: everyone's."""
        t = llm_usage.c
        q = (
            select(
                t.user,
                t.owner,
                t.endpoint,
                t.adapter,
                t.version,
                func.count().label("requests"),
                func.sum(t.prompt_tokens).label("prompt_tokens"),
                func.sum(t.completion_tokens).label("completion_tokens"),
            )
            .where(t.at >= since, t.at < until)
            .group_by(t.user, t.owner, t.endpoint, t.adapter, t.version)
            .order_by(t.user, t.owner, t.endpoint, t.adapter, t.version)
        )
        if users is not None:
            q = q.where(t.user.in_(list(users)))
        with self.reading() as conn:
            rows = conn.execute(q).all()
        return [
            {
                "user": r.user,
                "model": f"{r.owner}/{r.endpoint}" + (f":{r.adapter}" if r.adapter else ""),
                "version": r.version,
                "requests": r.requests,
                "prompt_tokens": int(r.prompt_tokens or 0),
                "completion_tokens": int(r.completion_tokens or 0),
                "total_tokens": int(r.prompt_tokens or 0) + int(r.completion_tokens or 0),
            }
            for r in rows
        ]
