"""Alerts can be acknowledged: who saw an alert, and when.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL for the alerts of before: nobody acknowledged them.
    op.add_column("gpulab_alerts", sa.Column("acknowledged_at", sa.DateTime(timezone=True)))
    op.add_column("gpulab_alerts", sa.Column("acknowledged_by", sa.String(255)))


def downgrade() -> None:
    op.drop_column("gpulab_alerts", "acknowledged_by")
    op.drop_column("gpulab_alerts", "acknowledged_at")
