"""The schema before migrations: allocations, jobs and deployments.

Revision ID: 0001
Revises:
Create Date: 2026-01-01

A database that ``metadata.create_all`` made before there were migrations
already has some or all of these tables (older ones lack the tables added
later); those are kept as they are, rows and all, and only the missing ones
are created. For a database with all three this is Alembic's ``stamp``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _tables() -> dict[str, tuple[list, list[tuple[str, list[str]]]]]:
    """Each table: its columns and constraints, and its indexes (name, columns)."""
    return {
        "gpulab_allocations": (
            [
                sa.Column("id", sa.String(32), primary_key=True),
                sa.Column("user", sa.String(255), nullable=False),
                sa.Column("owner_kind", sa.String(16), nullable=False),
                sa.Column("owner", sa.String(255), nullable=False),
                sa.Column("node", sa.String(255), nullable=False),
                sa.Column("gpu_uuid", sa.String(96), nullable=False),
                sa.Column("gpu_index", sa.Integer, nullable=False),
                sa.Column("milli", sa.Integer, nullable=False),
                sa.Column("memory_mib", sa.Integer, nullable=False),
                sa.Column("created", sa.DateTime(timezone=True), nullable=False),
                sa.UniqueConstraint(
                    "owner_kind", "owner", "gpu_uuid", name="one_share_per_gpu_per_owner"
                ),
            ],
            [("ix_allocations_user", ["user"])],
        ),
        "gpulab_jobs": (
            [
                sa.Column("id", sa.String(32), primary_key=True),
                sa.Column("user", sa.String(255), nullable=False),
                sa.Column("name", sa.String(63), nullable=False),
                sa.Column("state", sa.String(16), nullable=False),
                sa.Column("priority", sa.Integer, nullable=False),
                sa.Column("backend", sa.String(32), nullable=False),
                sa.Column("nodes", sa.Integer, nullable=False),
                sa.Column("nproc_per_node", sa.Integer, nullable=False),
                sa.Column("gpu_milli", sa.Integer, nullable=False),
                sa.Column("submitted", sa.DateTime(timezone=True), nullable=False),
                sa.Column("started", sa.DateTime(timezone=True)),
                sa.Column("finished", sa.DateTime(timezone=True)),
                sa.Column("message", sa.Text, nullable=False),
                sa.Column("error", sa.Text),
                sa.Column("restarts", sa.Integer, nullable=False),
            ],
            [("ix_jobs_state", ["state"]), ("ix_jobs_user", ["user"])],
        ),
        "gpulab_deployments": (
            [
                sa.Column("id", sa.String(32), primary_key=True),
                sa.Column("user", sa.String(255), nullable=False),
                sa.Column("name", sa.String(63), nullable=False),
                sa.Column("state", sa.String(16), nullable=False),
                sa.Column("replicas", sa.Integer, nullable=False),
                sa.Column("gpu_milli", sa.Integer, nullable=False),
                sa.Column("max_batch_size", sa.Integer, nullable=False),
                sa.Column("max_latency_ms", sa.Float, nullable=False),
                sa.Column("max_queue", sa.Integer, nullable=False),
                sa.Column("stop_with_server", sa.Boolean, nullable=False),
                sa.Column("share_users", sa.Text, nullable=False),
                sa.Column("share_groups", sa.Text, nullable=False),
                sa.Column("created", sa.DateTime(timezone=True), nullable=False),
                sa.Column("message", sa.Text, nullable=False),
                sa.Column("restarts", sa.Integer, nullable=False),
                sa.UniqueConstraint("user", "name", name="one_deployment_name_per_user"),
            ],
            [("ix_deployments_user", ["user"])],
        ),
    }


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    for name, (columns, indexes) in _tables().items():
        if name in existing:
            continue
        op.create_table(name, *columns)
        for index, cols in indexes:
            op.create_index(index, name, cols)


def downgrade() -> None:
    for name, (_, indexes) in reversed(_tables().items()):
        for index, _cols in indexes:
            op.drop_index(index, table_name=name)
        op.drop_table(name)
