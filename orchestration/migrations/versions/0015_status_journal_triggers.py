"""status journal triggers: the database refuses illegal status changes and writes the journal

Every status change of a run or a step was journaled by the code that made it, in five
places, and a fast path's own ``UPDATE`` of a status stood beside the guarded transition.
Now ``runs`` and ``steps`` carry the ``cause`` of their latest status, and triggers generated
from the state machine's tables (``orchestration.core.status_triggers``) refuse a change the
table does not allow (or a new row in a status it cannot start in) and write the journal
row from the row itself, whoever wrote it. The tables are frozen below: this migration keeps
creating what it created when ``states`` changes (a newer migration then re-creates them).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from orchestration.core.status_triggers import Machine, dropped, postgresql, sqlite

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_TERMINAL: tuple[str, ...] = ()
MACHINE = Machine(
    run_moves={
        "queued": ("cancelled", "cancelling", "failed", "interrupted", "running", "timed_out"),
        "running": (
            "cancelled",
            "cancelling",
            "completed",
            "failed",
            "interrupted",
            "parked",
            "timed_out",
            "waiting",
        ),
        "waiting": (
            "cancelled",
            "cancelling",
            "completed",
            "failed",
            "interrupted",
            "running",
            "timed_out",
        ),
        "parked": ("cancelled", "cancelling", "failed", "interrupted", "running", "timed_out"),
        "cancelling": ("cancelled", "interrupted", "timed_out"),
        "completed": _TERMINAL,
        "failed": _TERMINAL,
        "cancelled": _TERMINAL,
        "timed_out": _TERMINAL,
        "interrupted": _TERMINAL,
    },
    step_moves={
        "pending": ("cancelled", "failed", "running", "skipped", "timed_out"),
        "running": ("cancelled", "completed", "failed", "parked", "retrying", "timed_out"),
        "parked": ("cancelled", "failed", "retrying", "running", "timed_out"),
        "retrying": ("cancelled", "failed", "running", "timed_out"),
        "completed": _TERMINAL,
        "failed": _TERMINAL,
        "cancelled": _TERMINAL,
        "timed_out": _TERMINAL,
        "skipped": _TERMINAL,
    },
    run_initial=("completed", "queued"),
    step_initial=("completed", "pending"),
    step_silent="pending",
)


def upgrade() -> None:
    op.add_column("runs", sa.Column("cause", sa.Text(), nullable=True))
    op.add_column("steps", sa.Column("cause", sa.Text(), nullable=True))
    statements = postgresql(MACHINE) if _postgresql() else sqlite(MACHINE)
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    for statement in dropped(op.get_bind().dialect.name):
        op.execute(statement)
    with op.batch_alter_table("steps") as batch_op:
        batch_op.drop_column("cause")
    with op.batch_alter_table("runs") as batch_op:
        batch_op.drop_column("cause")


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"
