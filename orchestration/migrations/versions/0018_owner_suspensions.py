"""owner suspensions: an operator stops one owner, and the audit of each suspend and resume

``owner_suspensions`` holds one row per suspended owner (since when, why, by whom); a launch,
a schedule fire, a registration, an answer, an approval and the owner's API tokens are refused
while it exists (``orchestration.limits.suspensions``). ``owner_events`` keeps every suspend,
resume and cancel of live runs after the row is gone.

Revision ID: 0018
Revises: 0016
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "owner_suspensions",
        sa.Column("owner", sa.String(200), primary_key=True),
        sa.Column("suspended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("by", sa.String(200), nullable=False),
    )
    op.create_table(
        "owner_events",
        sa.Column("pk", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("by", sa.String(200), nullable=False),
        sa.Column(
            "detail",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
    )
    op.create_index("ix_owner_events_owner", "owner_events", ["owner", "at"])


def downgrade() -> None:
    op.drop_index("ix_owner_events_owner", table_name="owner_events")
    op.drop_table("owner_events")
    op.drop_table("owner_suspensions")
