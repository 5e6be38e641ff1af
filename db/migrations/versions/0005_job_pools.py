"""Pools: the pool a job runs in.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL for jobs of before pools: their backend's kind names the pool.
    op.add_column("gpulab_jobs", sa.Column("pool", sa.String(32)))


def downgrade() -> None:
    op.drop_column("gpulab_jobs", "pool")
