"""runs.claim becomes runs.concurrency: "claim" keeps one meaning, a step's start claim

``runs.claim`` held where a run stands on its concurrency key or its branch step's
``max_concurrency`` (``holding``, ``queued``, ``slot``), while "claim" elsewhere is a step's
start claim. The column is renamed; the unique partial index on the holder follows it (both
databases rewrite an index's predicate with the column).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE runs RENAME COLUMN claim TO concurrency")


def downgrade() -> None:
    op.execute("ALTER TABLE runs RENAME COLUMN concurrency TO claim")
