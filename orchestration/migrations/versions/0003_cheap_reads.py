"""cheap reads: indexes for run lists by status and live health, and for /metrics

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_LIVE = "status IN ('cancelling', 'parked', 'queued', 'running', 'waiting')"
_CANCELLED = "status = 'cancelled'"
_FINISHED = "finished_at IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runs_owner_status_created", ["owner", "status", "created_at"], unique=False
        )
        batch_op.create_index(
            "ix_runs_owner_live",
            ["owner", "created_at"],
            unique=False,
            postgresql_where=sa.text(_LIVE),
            sqlite_where=sa.text(_LIVE),
        )
        batch_op.create_index(
            "ix_runs_finished",
            ["finished_at", "status", "stop_reason"],
            unique=False,
            postgresql_where=sa.text(_FINISHED),
            sqlite_where=sa.text(_FINISHED),
        )
        batch_op.create_index(
            "ix_runs_cancel_latency",
            ["finished_at", "cancel_requested_at"],
            unique=False,
            postgresql_where=sa.text(_CANCELLED),
            sqlite_where=sa.text(_CANCELLED),
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_runs_cancel_latency",
            postgresql_where=sa.text(_CANCELLED),
            sqlite_where=sa.text(_CANCELLED),
        )
        batch_op.drop_index(
            "ix_runs_finished",
            postgresql_where=sa.text(_FINISHED),
            sqlite_where=sa.text(_FINISHED),
        )
        batch_op.drop_index(
            "ix_runs_owner_live",
            postgresql_where=sa.text(_LIVE),
            sqlite_where=sa.text(_LIVE),
        )
        batch_op.drop_index("ix_runs_owner_status_created")
