"""Tokens used through the OpenAI-compatible gateway, one row per call.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpulab_llm_usage",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("endpoint", sa.String(63), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
    )
    op.create_index("ix_llm_usage_at", "gpulab_llm_usage", ["at"])
    op.create_index("ix_llm_usage_user", "gpulab_llm_usage", ["user"])


def downgrade() -> None:
    op.drop_index("ix_llm_usage_user", "gpulab_llm_usage")
    op.drop_index("ix_llm_usage_at", "gpulab_llm_usage")
    op.drop_table("gpulab_llm_usage")
