"""The deployments table: one row per model endpoint, from create to stop.

The model files and the replicas' process records live in the deployment's
directory; the row holds what the API and the restart loop need. A stopped
deployment's row is deleted (its slices were released in the same step), so a
name can be used again. A change to it needs a revision in
``migrations/versions`` (see :mod:`.migrate`).
"""

from __future__ import annotations

import json

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Engine

from .engine import metadata, utcnow

# "starting": replicas launched, not all ready yet; "running": every replica
# answers ready; "degraded": some replica is down and being restarted;
# "failed": replicas kept crashing, the slices are released.
STATES = ("starting", "running", "degraded", "failed")

deployments = Table(
    "gpulab_deployments",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("user", String(255), nullable=False),
    Column("name", String(63), nullable=False),
    Column("state", String(16), nullable=False),
    Column("replicas", Integer, nullable=False),
    Column("gpu_milli", Integer, nullable=False),  # per replica
    Column("max_batch_size", Integer, nullable=False),
    Column("max_latency_ms", Float, nullable=False),
    Column("max_queue", Integer, nullable=False),
    Column("stop_with_server", Boolean, nullable=False, default=False),
    Column("share_users", Text, nullable=False, default="[]"),  # JSON list
    Column("share_groups", Text, nullable=False, default="[]"),  # JSON list
    Column("created", DateTime(timezone=True), nullable=False),
    Column("message", Text, nullable=False, default=""),
    Column("restarts", Integer, nullable=False, default=0),
    UniqueConstraint("user", "name", name="one_deployment_name_per_user"),
    Index("ix_deployments_user", "user"),
)

_JSON = ("share_users", "share_groups")


def _row(r) -> dict:
    d = dict(r._mapping)
    d["created"] = d["created"].isoformat()
    for k in _JSON:
        d[k] = json.loads(d[k] or "[]")
    return d


class NameTaken(Exception):
    """The user already has a deployment of that name."""


class DeploymentStore:
    def __init__(self, engine: Engine):
        self.engine = engine

    def add(self, dep: dict) -> dict:
        row = {
            "state": "starting",
            "message": "starting",
            "restarts": 0,
            "created": utcnow(),
            "stop_with_server": False,
            **dep,
        }
        for k in _JSON:
            row[k] = json.dumps(sorted(row.get(k) or []))
        with self.engine.begin() as conn:
            taken = conn.execute(
                select(deployments.c.id).where(
                    (deployments.c.user == row["user"]) & (deployments.c.name == row["name"])
                )
            ).first()
            if taken:
                raise NameTaken(row["name"])
            conn.execute(insert(deployments), [row])
        return self.get(row["id"])

    def get(self, dep_id: str) -> dict | None:
        with self.engine.connect() as conn:
            r = conn.execute(select(deployments).where(deployments.c.id == dep_id)).first()
        return _row(r) if r else None

    def find(self, user: str, name: str) -> dict | None:
        with self.engine.connect() as conn:
            r = conn.execute(
                select(deployments).where(
                    (deployments.c.user == user) & (deployments.c.name == name)
                )
            ).first()
        return _row(r) if r else None

    def list(self, user: str | None = None) -> list[dict]:
        q = select(deployments).order_by(deployments.c.created, deployments.c.id)
        if user is not None:
            q = q.where(deployments.c.user == user)
        with self.engine.connect() as conn:
            return [_row(r) for r in conn.execute(q)]

    def update(self, dep_id: str, **values) -> None:
        for k in _JSON:
            if k in values:
                values[k] = json.dumps(sorted(values[k]))
        with self.engine.begin() as conn:
            conn.execute(update(deployments).where(deployments.c.id == dep_id).values(**values))

    def remove(self, dep_id: str) -> bool:
        with self.engine.begin() as conn:
            return conn.execute(delete(deployments).where(deployments.c.id == dep_id)).rowcount == 1
