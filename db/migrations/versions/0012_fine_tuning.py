"""The fine-tuning API's files and jobs (``/v1/files``, ``/v1/fine_tuning/jobs``).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpulab_ft_files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.Integer, nullable=False),
        sa.Column("lines", sa.Integer, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_ft_files_user", "gpulab_ft_files", ["user"])
    op.create_table(
        "gpulab_ft_jobs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("deployment_id", sa.String(32), nullable=False),
        sa.Column("training_file", sa.String(40), nullable=False),
        sa.Column("hyperparameters", sa.Text, nullable=False),
        sa.Column("suffix", sa.String(64)),
        sa.Column("adapter", sa.String(63), nullable=False),
        sa.Column("job_id", sa.String(32)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("fine_tuned_model", sa.String(255)),
        sa.Column("error", sa.Text),
        sa.Column("trained_tokens", sa.Integer),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished", sa.DateTime(timezone=True)),
    )
    op.create_index("ix_ft_jobs_user", "gpulab_ft_jobs", ["user"])


def downgrade() -> None:
    op.drop_index("ix_ft_jobs_user", "gpulab_ft_jobs")
    op.drop_table("gpulab_ft_jobs")
    op.drop_index("ix_ft_files_user", "gpulab_ft_files")
    op.drop_table("gpulab_ft_files")
