"""Vector collections: one row per collection (the vectors live in the vector engine).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpulab_collections",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("dim", sa.Integer, nullable=False),
        sa.Column("metric", sa.String(16), nullable=False),
        sa.Column("index_type", sa.String(16), nullable=False),
        sa.Column("embed", sa.String(255)),
        sa.Column("share_users", sa.Text, nullable=False),
        sa.Column("share_groups", sa.Text, nullable=False),
        sa.Column("lineage", sa.Text, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("user", "name", name="one_collection_name_per_user"),
    )
    op.create_index("ix_collections_user", "gpulab_collections", ["user"])


def downgrade() -> None:
    op.drop_index("ix_collections_user", "gpulab_collections")
    op.drop_table("gpulab_collections")
