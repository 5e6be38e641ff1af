"""Hibernations: a server's kernels saved and its slice given back.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpulab_hibernations",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("server", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("gpu_milli", sa.Integer, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished", sa.DateTime(timezone=True)),
        sa.Column("woken_at", sa.DateTime(timezone=True)),
        sa.Column("kernels", sa.Integer, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("detail", sa.Text, nullable=False),
    )
    op.create_index("ix_hibernations_user", "gpulab_hibernations", ["user", "server"])


def downgrade() -> None:
    op.drop_index("ix_hibernations_user", "gpulab_hibernations")
    op.drop_table("gpulab_hibernations")
