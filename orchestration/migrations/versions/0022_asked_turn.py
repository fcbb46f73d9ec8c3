"""the turn a human's answer resumes: ``steps.asked_turn``

An answer starts the step's next attempt; the runtime may name the turn that asked only by
ids it made itself (an MCP task and its session), so the step keeps that turn's reference.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    # Plain ADD COLUMN (no batch copy): SQLite keeps the status triggers on steps.
    op.add_column("steps", sa.Column("asked_turn", _JSON, nullable=True))


def downgrade() -> None:
    # Not a batch copy, which would lose the status triggers on SQLite (3.35 drops columns).
    op.execute("ALTER TABLE steps DROP COLUMN asked_turn")
