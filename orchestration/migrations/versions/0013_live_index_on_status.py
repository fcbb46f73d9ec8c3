"""ix_runs_live on status alone: a poll's stamp of the run becomes a HOT update

Every poll moves ``runs.deadline_at``; with it in ``ix_runs_live`` no poll could update the
row in place, and each wrote a new entry into every index of the table.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_LIVE = sa.text("status IN ('cancelling', 'parked', 'queued', 'running', 'waiting')")


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_live", postgresql_where=_LIVE, sqlite_where=_LIVE)
        batch_op.create_index(
            "ix_runs_live", ["status"], postgresql_where=_LIVE, sqlite_where=_LIVE
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_live", postgresql_where=_LIVE, sqlite_where=_LIVE)
        batch_op.create_index(
            "ix_runs_live",
            ["status", "deadline_at"],
            postgresql_where=_LIVE,
            sqlite_where=_LIVE,
        )
