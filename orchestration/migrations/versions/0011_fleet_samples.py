"""fleet samples: poll lateness and sweep time per source and period, for the fleet page

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet_samples",
        sa.Column("pk", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("series", sa.String(40), nullable=False),
        sa.Column("source", sa.String(200), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
        sa.Column("largest", sa.Float(), nullable=False),
        sa.Column(
            "buckets",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
    )
    op.create_index("ix_fleet_samples_at", "fleet_samples", ["at"])


def downgrade() -> None:
    op.drop_index("ix_fleet_samples_at", table_name="fleet_samples")
    op.drop_table("fleet_samples")
