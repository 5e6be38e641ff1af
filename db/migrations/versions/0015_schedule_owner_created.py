"""When the hub made a schedule's owner: a later user given the name is not its owner.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Schedules from before: NULL, judged by the schedule's own creation time.
    with op.batch_alter_table("gpulab_schedules") as batch:
        batch.add_column(sa.Column("owner_created", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("gpulab_schedules") as batch:
        batch.drop_column("owner_created")
