"""Lineage of endpoint versions: where each version's model came from.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # JSON {"created_by", "job", "quantization"}; NULL for the versions of before,
    # which then say they come from no known job rather than guess.
    op.add_column("gpulab_deployment_versions", sa.Column("lineage", sa.Text))


def downgrade() -> None:
    op.drop_column("gpulab_deployment_versions", "lineage")
