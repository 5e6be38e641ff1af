"""Scheduled jobs (Jupyter Scheduler's job definitions with a schedule) and their runs.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpulab_schedules",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("schedule", sa.String(255), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("active", sa.Boolean, nullable=False),
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("meta", sa.Text, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_run", sa.DateTime(timezone=True)),
        sa.Column("last_run", sa.DateTime(timezone=True)),
        sa.Column("last_error", sa.Text),
    )
    op.create_index("ix_schedules_user", "gpulab_schedules", ["user"])
    op.create_index("ix_schedules_next_run", "gpulab_schedules", ["next_run"])
    op.create_table(
        "gpulab_schedule_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("schedule_id", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("fired", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_schedule_runs_schedule", "gpulab_schedule_runs", ["schedule_id"])


def downgrade() -> None:
    op.drop_index("ix_schedule_runs_schedule", "gpulab_schedule_runs")
    op.drop_table("gpulab_schedule_runs")
    op.drop_index("ix_schedules_next_run", "gpulab_schedules")
    op.drop_index("ix_schedules_user", "gpulab_schedules")
    op.drop_table("gpulab_schedules")
