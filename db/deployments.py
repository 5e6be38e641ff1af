"""The deployments tables: one row per model endpoint, one per version of it.

A deployment (``gpulab_deployments``) is the endpoint a caller names: owner,
name, sharing, and how many replicas each version may run (``replicas`` is the
least, ``max_replicas`` the most; equal for a fixed count). Its versions
(``gpulab_deployment_versions``) are what runs: a model, the batching settings,
the share of calls it gets (``weight``, 0-100) and how many replicas it runs
now. Version 1's id is the deployment's id. The model files and the replicas'
process records live in each version's directory (named by the version's id).
A stopped deployment's rows are deleted (its slices were released in the same
step), so a name can be used again. A change here needs a revision in
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

from .engine import metadata, utcnow
from .store import Store, json_columns

# "starting": replicas launched, not all ready yet; "running": every replica
# answers ready; "degraded": some replica is down and being restarted;
# "idle": scaled to zero (min_replicas 0), the next call starts a replica;
# "failed": replicas kept crashing, the slices are released.
STATES = ("starting", "running", "degraded", "idle", "failed")

deployments = Table(
    "gpulab_deployments",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("user", String(255), nullable=False),
    Column("name", String(63), nullable=False),
    Column("state", String(16), nullable=False),
    Column("replicas", Integer, nullable=False),  # the least each version runs
    Column("max_replicas", Integer, nullable=False),
    Column("target_inflight", Float, nullable=False),  # requests in flight per replica
    Column("scale_down_delay_s", Float, nullable=False),
    # Roll a canary back when its error rate passes the stable's by this (0-1); None: never.
    Column("rollback_margin", Float),
    Column("gpu_milli", Integer, nullable=False),  # per replica, of new versions
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

versions = Table(
    "gpulab_deployment_versions",
    metadata,
    Column("id", String(32), primary_key=True),  # its directory and ledger owners' prefix
    Column("deployment_id", String(32), nullable=False),
    Column("version", Integer, nullable=False),
    Column("weight", Integer, nullable=False),  # share of calls, 0-100
    Column("replicas", Integer, nullable=False),  # running now (the autoscaler's count)
    Column("gpu_milli", Integer, nullable=False),
    Column("max_batch_size", Integer, nullable=False),
    Column("max_latency_ms", Float, nullable=False),
    Column("max_queue", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("message", Text, nullable=False, default=""),
    Column("restarts", Integer, nullable=False, default=0),
    Column("created", DateTime(timezone=True), nullable=False),
    # Where its model came from, JSON {"created_by", "job", "quantization"}
    # (service/endpoints/lineage.py); NULL for versions of before it was kept.
    Column("lineage", Text),
    UniqueConstraint("deployment_id", "version", name="one_version_number_per_deployment"),
    Index("ix_versions_deployment", "deployment_id"),
)

_JSON = ("share_users", "share_groups")
#: What a version takes from its deployment when none is given.
UNIT_SETTINGS = ("gpu_milli", "max_batch_size", "max_latency_ms", "max_queue")


def _row(r) -> dict:
    d = dict(r._mapping)
    d["created"] = d["created"].isoformat()
    for k in _JSON:
        d[k] = json.loads(d[k] or "[]")
    return d


def _version(r) -> dict:
    d = dict(r._mapping)
    d["created"] = d["created"].isoformat()
    d["lineage"] = json.loads(d["lineage"]) if d.get("lineage") else None
    return d


class NameTaken(Exception):
    """The user already has a deployment of that name."""


class DeploymentStore(Store):
    def add(self, dep: dict, lineage: dict | None = None) -> dict:
        """A new deployment and its version 1 (same id, ``lineage`` its model's), in
        one transaction."""
        row = {
            "state": "starting",
            "message": "starting",
            "restarts": 0,
            "created": utcnow(),
            "stop_with_server": False,
            "max_replicas": dep["replicas"],
            "rollback_margin": None,
            "share_users": [],
            "share_groups": [],
            **dep,
        }
        row = json_columns(row, lists=_JSON)
        # A writer from BEGIN: SQLite refuses at once (no busy wait) to turn this
        # read-then-insert into a write while the job queue writes.
        with self.writing() as conn:
            self.insert_named(conn, deployments, row, NameTaken)
            conn.execute(
                insert(versions),
                [
                    {
                        "id": row["id"],
                        "deployment_id": row["id"],
                        "version": 1,
                        "weight": 100,
                        # At least one, even with min_replicas 0: a model that does not
                        # load fails at deploy time, not at the first call.
                        "replicas": max(row["replicas"], 1),
                        "state": "starting",
                        "message": "starting",
                        "restarts": 0,
                        "created": row["created"],
                        "lineage": json.dumps(lineage) if lineage is not None else None,
                        **{k: row[k] for k in UNIT_SETTINGS},
                    }
                ],
            )
        return self.get(row["id"])

    # -- versions --------------------------------------------------------------------
    def add_version(
        self, dep_id: str, version_id: str, weight: int, settings: dict, lineage: dict | None = None
    ) -> dict:
        """Version ``n+1`` of a deployment (``settings``: UNIT_SETTINGS and ``replicas``;
        ``lineage``: its model's)."""
        with self.writing() as conn:
            last = conn.execute(
                select(versions.c.version)
                .where(versions.c.deployment_id == dep_id)
                .order_by(versions.c.version.desc())
            ).first()
            conn.execute(
                insert(versions),
                [
                    {
                        "id": version_id,
                        "deployment_id": dep_id,
                        "version": (last[0] if last else 0) + 1,
                        "weight": weight,
                        "state": "starting",
                        "message": "starting",
                        "restarts": 0,
                        "created": utcnow(),
                        "lineage": json.dumps(lineage) if lineage is not None else None,
                        **settings,
                    }
                ],
            )
        return self.version(version_id)

    def version(self, version_id: str) -> dict | None:
        return self.by_id(versions, version_id, _version)

    def versions(self, dep_id: str | None = None) -> list[dict]:
        """A deployment's versions (all deployments' with None), oldest first."""
        q = select(versions).order_by(versions.c.deployment_id, versions.c.version)
        if dep_id is not None:
            q = q.where(versions.c.deployment_id == dep_id)
        return self.all(q, _version)

    def update_version(self, version_id: str, **values) -> None:
        self.update_by_id(versions, version_id, values)

    def set_weights(self, weights: dict[str, int]) -> None:
        """Several versions' weights at once (a promotion or a rollback)."""
        with self.writing() as conn:
            for version_id, weight in weights.items():
                conn.execute(
                    update(versions).where(versions.c.id == version_id).values(weight=weight)
                )

    def remove_version(self, version_id: str) -> None:
        self.delete_where(versions, versions.c.id == version_id)

    def get(self, dep_id: str) -> dict | None:
        return self.by_id(deployments, dep_id, _row)

    def find(self, user: str, name: str) -> dict | None:
        return self.by_name(deployments, user, name, _row)

    def list(self, user: str | None = None) -> list[dict]:
        return self.of_user(deployments, user, (deployments.c.created, deployments.c.id), _row)

    def update(self, dep_id: str, **values) -> None:
        self.update_by_id(deployments, dep_id, json_columns(values, lists=_JSON))

    def remove(self, dep_id: str) -> bool:
        with self.writing() as conn:
            conn.execute(delete(versions).where(versions.c.deployment_id == dep_id))
            return conn.execute(delete(deployments).where(deployments.c.id == dep_id)).rowcount == 1
