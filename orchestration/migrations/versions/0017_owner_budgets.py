"""owner budgets: branch runs count as live runs, and an operator's own values per owner

An owner's ``ORCH_MAX_ACTIVE_RUNS_PER_OWNER`` did not count its branch runs, so one owner
could run ``ORCH_MAX_BRANCHES`` branch runs under each of its runs at once (issue 30). The
triggers of migration 0014 counted top-level runs only; they now count every run, branch runs
included, and the counts are written again from the rows under a lock that keeps runs from
being written meanwhile. The table ``owner_budgets`` holds an operator's own values of an
owner's budgets (``orchestration owners set``), each ``NULL`` for the setting's.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_LIVE = "('cancelling', 'parked', 'queued', 'running', 'waiting')"

#: (trigger, event, condition) of migration 0014, and the same with branch runs counted.
_TOP_LEVEL = (
    ("runs_live_inserted", "INSERT", f"NEW.parent_run_id IS NULL AND NEW.status IN {_LIVE}"),
    (
        "runs_live_ended",
        "UPDATE OF status",
        f"OLD.parent_run_id IS NULL AND OLD.status IN {_LIVE} AND NEW.status NOT IN {_LIVE}",
    ),
    ("runs_live_deleted", "DELETE", f"OLD.parent_run_id IS NULL AND OLD.status IN {_LIVE}"),
)
_EVERY_RUN = (
    ("runs_live_inserted", "INSERT", f"NEW.status IN {_LIVE}"),
    ("runs_live_ended", "UPDATE OF status", f"OLD.status IN {_LIVE} AND NEW.status NOT IN {_LIVE}"),
    ("runs_live_deleted", "DELETE", f"OLD.status IN {_LIVE}"),
)

_SQLITE_ADD = """
INSERT INTO live_run_counts (owner, slot, live) VALUES ('', 0, {change}), ({row}.owner, 0, {change})
ON CONFLICT (owner, slot) DO UPDATE SET live = live + excluded.live;
"""


def upgrade() -> None:
    _count(_EVERY_RUN, "")
    op.create_table(
        "owner_budgets",
        sa.Column("owner", sa.String(200), primary_key=True),
        sa.Column("max_active_runs", sa.Integer(), nullable=True),
        sa.Column("max_live_turns", sa.Integer(), nullable=True),
        sa.Column("max_definitions", sa.Integer(), nullable=True),
        sa.Column("max_stored_bytes", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("owner_budgets")
    _count(_TOP_LEVEL, "AND parent_run_id IS NULL")


def _count(events: tuple[tuple[str, str, str], ...], which: str) -> None:
    """Make the triggers count the runs ``events`` name, and count those already there."""
    postgresql = op.get_bind().dialect.name == "postgresql"
    if postgresql:
        op.execute("LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE")
    for name, event, condition in events:
        if postgresql:
            op.execute(f"DROP TRIGGER {name} ON runs")
            op.execute(
                f"CREATE CONSTRAINT TRIGGER {name} AFTER {event} ON runs "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ({condition}) "
                "EXECUTE FUNCTION orch_count_live_run()"
            )
        else:
            row, change = ("NEW", 1) if event == "INSERT" else ("OLD", -1)
            op.execute(f"DROP TRIGGER {name}")
            op.execute(
                f"CREATE TRIGGER {name} AFTER {event} ON runs WHEN {condition} BEGIN"
                + _SQLITE_ADD.format(row=row, change=change)
                + "END"
            )
    live = f"FROM runs WHERE status IN {_LIVE} {which}"
    op.execute("DELETE FROM live_run_counts")
    op.execute(
        f"INSERT INTO live_run_counts (owner, slot, live) SELECT owner, 0, count(*) {live} "
        "GROUP BY owner"
    )
    op.execute(f"INSERT INTO live_run_counts (owner, slot, live) SELECT '', 0, count(*) {live}")
