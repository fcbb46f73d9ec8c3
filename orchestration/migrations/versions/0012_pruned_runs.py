"""pruned runs: what a prune deleted, counted, so that /metrics counters never go down

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pruned_runs",
        sa.Column("hour", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("status", sa.String(32), primary_key=True),
        sa.Column("stop_reason", sa.String(40), primary_key=True),
        sa.Column("bucket", sa.Integer(), primary_key=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("latency_seconds", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("pruned_runs")
