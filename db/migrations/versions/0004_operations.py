"""Operations: the audit trail, alerts and cordoned GPUs.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpulab_audit",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("actor_kind", sa.String(16), nullable=False),
        sa.Column("user", sa.String(255)),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("source", sa.String(255), nullable=False),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
    )
    op.create_index("ix_audit_ts", "gpulab_audit", ["ts"])
    op.create_index("ix_audit_user", "gpulab_audit", ["user"])
    op.create_index("ix_audit_actor", "gpulab_audit", ["actor"])
    op.create_table(
        "gpulab_alerts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(400), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("subject_kind", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("owner", sa.String(255)),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("labels", sa.Text, nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True)),
        sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_alerts_key", "gpulab_alerts", ["key"])
    op.create_index("ix_alerts_owner", "gpulab_alerts", ["owner"])
    op.create_index("ix_alerts_resolved", "gpulab_alerts", ["resolved_at"])
    op.create_table(
        "gpulab_gpu_cordons",
        sa.Column("gpu_uuid", sa.String(96), primary_key=True),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("by", sa.String(255), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gpulab_gpu_cordons")
    for index in ("ix_alerts_resolved", "ix_alerts_owner", "ix_alerts_key"):
        op.drop_index(index, table_name="gpulab_alerts")
    op.drop_table("gpulab_alerts")
    for index in ("ix_audit_actor", "ix_audit_user", "ix_audit_ts"):
        op.drop_index(index, table_name="gpulab_audit")
    op.drop_table("gpulab_audit")
