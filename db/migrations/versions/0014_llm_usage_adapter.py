"""The LoRA adapter a call through the OpenAI gateway named ('' for the base model).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows from before: calls to the base model.
    with op.batch_alter_table("gpulab_llm_usage") as batch:
        batch.add_column(sa.Column("adapter", sa.String(63), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("gpulab_llm_usage") as batch:
        batch.drop_column("adapter")
