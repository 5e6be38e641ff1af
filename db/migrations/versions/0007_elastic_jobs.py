"""Elastic jobs: their node range, their resizes, and a resize under way.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL for fixed-size jobs (and every job of before).
    op.add_column("gpulab_jobs", sa.Column("min_nodes", sa.Integer))
    op.add_column("gpulab_jobs", sa.Column("max_nodes", sa.Integer))
    op.add_column("gpulab_jobs", sa.Column("resizes", sa.Text))
    op.add_column("gpulab_jobs", sa.Column("resizing", sa.Text))


def downgrade() -> None:
    for column in ("resizing", "resizes", "max_nodes", "min_nodes"):
        op.drop_column("gpulab_jobs", column)
