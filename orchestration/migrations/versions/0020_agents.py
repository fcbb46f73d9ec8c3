"""The operator's agent registry, and what each step ran on

``agents`` holds the agents steps may name (``agent: NAME``); ``runs.agents`` keeps the
entries a run's steps named as they were at launch; ``steps.evidence`` what the step's agent
said of itself at launch and at the turn's start.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("name", sa.String(length=80), primary_key=True),
        sa.Column("provider", sa.String(length=40), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(length=200), nullable=True),
        sa.Column("options", _JSON, nullable=False),
        sa.Column("pin", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    # Plain ADD COLUMN (no batch copy): SQLite keeps the status triggers on runs and steps.
    op.add_column("runs", sa.Column("agents", _JSON, nullable=True))
    op.add_column("steps", sa.Column("evidence", _JSON, nullable=True))


def downgrade() -> None:
    # Not a batch copy, which would lose the status triggers on SQLite (3.35 drops columns).
    op.execute("ALTER TABLE steps DROP COLUMN evidence")
    op.execute("ALTER TABLE runs DROP COLUMN agents")
    op.drop_table("agents")
