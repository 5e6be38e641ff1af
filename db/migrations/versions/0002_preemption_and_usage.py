"""Preemption on jobs (class, preemptible, count, in-progress) and the usage table.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Existing jobs become ``batch``, preemptible, never preempted: what they were.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN (SQLite and PostgreSQL both take it with a default).
    for column in (
        sa.Column("priority_class", sa.String(63), nullable=False, server_default="batch"),
        sa.Column("preemptible", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("preemptions", sa.Integer, nullable=False, server_default="0"),
        sa.Column("preempting", sa.Text),
    ):
        op.add_column("gpulab_jobs", column)
    op.create_table(
        "gpulab_usage",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("owner_kind", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("gpu_uuid", sa.String(96), nullable=False),
        sa.Column("milli", sa.Integer, nullable=False),
        sa.Column("started", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended", sa.DateTime(timezone=True), nullable=False),
        sa.Column("milli_seconds", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_usage_ended", "gpulab_usage", ["ended"])
    op.create_index("ix_usage_user", "gpulab_usage", ["user"])


def downgrade() -> None:
    op.drop_index("ix_usage_user", table_name="gpulab_usage")
    op.drop_index("ix_usage_ended", table_name="gpulab_usage")
    op.drop_table("gpulab_usage")
    with op.batch_alter_table("gpulab_jobs") as batch:
        for column in ("preempting", "preemptions", "preemptible", "priority_class"):
            batch.drop_column(column)
