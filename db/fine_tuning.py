"""The fine-tuning API's tables: the files users upload (``/v1/files``) and the
fine-tuning jobs (``/v1/fine_tuning/jobs``) that train on them.

A file's bytes live on disk (:mod:`gpulab.service.endpoints.fine_tuning_files`);
its row is who owns it and what it is. A fine-tuning job's row is the OpenAI
object the caller sees (status, hyperparameters, the model it made) and the
gpulab job that does the training (``job_id``), so its progress and accounting
are a job's like any other. A change here needs a revision in
``migrations/versions`` (see :mod:`.migrate`).
"""

from __future__ import annotations

import json

from sqlalchemy import (
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    func,
    insert,
    select,
)

from .engine import metadata, utcnow
from .store import Store, json_columns

ft_files = Table(
    "gpulab_ft_files",
    metadata,
    Column("id", String(40), primary_key=True),  # "file-<hex>"
    Column("user", String(255), nullable=False),
    Column("filename", String(255), nullable=False),
    Column("purpose", String(32), nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("lines", Integer, nullable=False),  # training examples (JSONL lines)
    Column("created", DateTime(timezone=True), nullable=False),
    Index("ix_ft_files_user", "user"),
)

ft_jobs = Table(
    "gpulab_ft_jobs",
    metadata,
    Column("id", String(40), primary_key=True),  # "ftjob-<hex>"
    Column("user", String(255), nullable=False),
    Column("model", String(255), nullable=False),  # the base as the caller named it
    Column("deployment_id", String(32), nullable=False),  # the base endpoint
    Column("training_file", String(40), nullable=False),
    Column("hyperparameters", Text, nullable=False, default="{}"),  # JSON object
    Column("suffix", String(64)),
    Column("adapter", String(63), nullable=False),  # the adapter's name on the base
    Column("job_id", String(32)),  # the gpulab job that trains
    # validating_files, queued, running, succeeded, failed, cancelled (OpenAI's)
    Column("status", String(16), nullable=False),
    Column("fine_tuned_model", String(255)),
    Column("error", Text),
    Column("trained_tokens", Integer),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("finished", DateTime(timezone=True)),
    Index("ix_ft_jobs_user", "user"),
)

#: Where a fine-tuning job stays once there.
FINAL = ("succeeded", "failed", "cancelled")


def _job(r) -> dict:
    d = dict(r._mapping)
    d["hyperparameters"] = json.loads(d["hyperparameters"] or "{}")
    return d


class FineTuningStore(Store):
    """Rows of both tables; every query of a user's rows names the user."""

    # -- files ---------------------------------------------------------------------
    def add_file(self, row: dict) -> dict:
        with self.writing() as conn:
            conn.execute(insert(ft_files), [{"created": utcnow(), **row}])
        return self.file(row["id"])

    def file(self, fid: str) -> dict | None:
        return self.by_id(ft_files, fid)

    def files(self, user: str) -> list[dict]:
        return self.of_user(ft_files, user, (ft_files.c.created.desc(),))

    def file_bytes(self, user: str) -> int:
        """What ``user``'s training files hold together, counted in SQL."""
        with self.reading() as conn:
            q = select(func.coalesce(func.sum(ft_files.c.bytes), 0)).where(ft_files.c.user == user)
            return int(conn.execute(q).scalar())

    def remove_file(self, fid: str) -> None:
        self.delete_where(ft_files, ft_files.c.id == fid)

    # -- jobs ----------------------------------------------------------------------
    def add_job(self, row: dict) -> dict:
        row = {"created": utcnow(), **row}
        row["hyperparameters"] = json.dumps(row.get("hyperparameters") or {})
        with self.writing() as conn:
            conn.execute(insert(ft_jobs), [row])
        return self.job(row["id"])

    def job(self, jid: str) -> dict | None:
        return self.by_id(ft_jobs, jid, _job)

    def jobs(self, user: str | None = None, open_only: bool = False) -> list[dict]:
        """``user``'s jobs, newest first (every user's: None); ``open_only``: not final."""
        q = select(ft_jobs).order_by(ft_jobs.c.created.desc())
        if user is not None:
            q = q.where(ft_jobs.c.user == user)
        if open_only:
            q = q.where(ft_jobs.c.status.not_in(FINAL))
        return self.all(q, _job)

    def open_jobs_of(self, user: str) -> int:
        """How many of ``user``'s fine-tuning jobs have not ended, counted in SQL."""
        q = select(func.count()).where((ft_jobs.c.user == user) & ft_jobs.c.status.not_in(FINAL))
        with self.reading() as conn:
            return int(conn.execute(q).scalar())

    def remove_job(self, jid: str) -> None:
        """The job's row (its gpulab job, as it ended, stays in the jobs' table)."""
        self.delete_where(ft_jobs, ft_jobs.c.id == jid)

    def update_job(self, jid: str, **values) -> dict | None:
        values = json_columns(values, objects=("hyperparameters",))
        if values.get("status") in FINAL and "finished" not in values:
            values["finished"] = utcnow()
        self.update_by_id(ft_jobs, jid, values)
        return self.job(jid)
