"""turn stop and start claim: where the provider cancel of an ended step's turn is, and
when the current execution claimed its provider start

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("turn_stop", json_type, nullable=True))
        batch_op.add_column(
            sa.Column("start_claimed_at", sa.DateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_column("start_claimed_at")
        batch_op.drop_column("turn_stop")
