"""run deletions: the audit of runs their owners deleted (``orchestration delete``)

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_deletions",
        sa.Column("pk", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("workflow", sa.String(220), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("by", sa.String(200), nullable=False),
        sa.Column("branch_runs", sa.Integer(), nullable=False),
    )
    op.create_index("ix_run_deletions_deleted", "run_deletions", ["deleted_at"])


def downgrade() -> None:
    op.drop_index("ix_run_deletions_deleted", table_name="run_deletions")
    op.drop_table("run_deletions")
