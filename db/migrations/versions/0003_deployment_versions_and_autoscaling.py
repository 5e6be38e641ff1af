"""Deployment versions (canaries) and autoscaling settings.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Every existing deployment becomes version 1 of itself (same id, so its directory
and its slices' ledger owners stay as they are), with all the calls, and a fixed
count: ``max_replicas`` = ``replicas``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for column in (
        sa.Column("max_replicas", sa.Integer, nullable=False, server_default="1"),
        sa.Column("target_inflight", sa.Float, nullable=False, server_default="32"),
        sa.Column("scale_down_delay_s", sa.Float, nullable=False, server_default="300"),
        sa.Column("rollback_margin", sa.Float),
    ):
        op.add_column("gpulab_deployments", column)
    op.execute("UPDATE gpulab_deployments SET max_replicas = replicas")
    op.execute("UPDATE gpulab_deployments SET target_inflight = max_batch_size")
    op.create_table(
        "gpulab_deployment_versions",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("deployment_id", sa.String(32), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("weight", sa.Integer, nullable=False),
        sa.Column("replicas", sa.Integer, nullable=False),
        sa.Column("gpu_milli", sa.Integer, nullable=False),
        sa.Column("max_batch_size", sa.Integer, nullable=False),
        sa.Column("max_latency_ms", sa.Float, nullable=False),
        sa.Column("max_queue", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("restarts", sa.Integer, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("deployment_id", "version", name="one_version_number_per_deployment"),
    )
    op.create_index("ix_versions_deployment", "gpulab_deployment_versions", ["deployment_id"])
    op.execute(
        "INSERT INTO gpulab_deployment_versions (id, deployment_id, version, weight, "
        "replicas, gpu_milli, max_batch_size, max_latency_ms, max_queue, state, message, "
        "restarts, created) SELECT id, id, 1, 100, replicas, gpu_milli, max_batch_size, "
        "max_latency_ms, max_queue, state, message, restarts, created FROM gpulab_deployments"
    )


def downgrade() -> None:
    op.drop_index("ix_versions_deployment", table_name="gpulab_deployment_versions")
    op.drop_table("gpulab_deployment_versions")
    with op.batch_alter_table("gpulab_deployments") as batch:
        for column in ("rollback_margin", "scale_down_delay_s", "target_inflight", "max_replicas"):
            batch.drop_column(column)
