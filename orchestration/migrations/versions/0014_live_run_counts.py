"""live run counts: kept by triggers on runs, so that a launch's admission reads a few rows

A launch counted the live runs, in all and of its owner, at every launch: its cost grew with
the live runs (``orchestration.limits.live_counts``). The counts are now rows that triggers on
``runs`` keep: a top-level run inserted live adds one, one that leaves the live statuses or
is deleted while live takes one away. On PostgreSQL the triggers are deferred to the commit
and add to the slot of the connection (``pg_backend_pid() % 16``), the total's row first; on
SQLite there is one row per count. The counts of the runs already there are written under a
lock that keeps runs from being written meanwhile.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_LIVE = "('cancelling', 'parked', 'queued', 'running', 'waiting')"

_PG_COUNT = """
CREATE FUNCTION orch_count_live_run() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_owner varchar;
    v_change integer;
    v_slot smallint := pg_backend_pid() % 16;
BEGIN
    IF TG_OP = 'INSERT' THEN
        v_owner := NEW.owner;
        v_change := 1;
    ELSE
        v_owner := OLD.owner;
        v_change := -1;
    END IF;
    INSERT INTO live_run_counts (owner, slot, live)
    VALUES ('', v_slot, v_change), (v_owner, v_slot, v_change)
    ON CONFLICT (owner, slot) DO UPDATE SET live = live_run_counts.live + EXCLUDED.live;
    RETURN NULL;
END
$$
"""

_PG_TRUNCATED = """
CREATE FUNCTION orch_forget_live_runs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM live_run_counts;
    RETURN NULL;
END
$$
"""

#: (trigger, event, condition): a top-level run that becomes live, or stops being live.
_EVENTS = (
    ("runs_live_inserted", "INSERT", f"NEW.parent_run_id IS NULL AND NEW.status IN {_LIVE}"),
    (
        "runs_live_ended",
        "UPDATE OF status",
        f"OLD.parent_run_id IS NULL AND OLD.status IN {_LIVE} AND NEW.status NOT IN {_LIVE}",
    ),
    ("runs_live_deleted", "DELETE", f"OLD.parent_run_id IS NULL AND OLD.status IN {_LIVE}"),
)

_SQLITE_ADD = """
INSERT INTO live_run_counts (owner, slot, live) VALUES ('', 0, {change}), ({row}.owner, 0, {change})
ON CONFLICT (owner, slot) DO UPDATE SET live = live + excluded.live;
"""


def upgrade() -> None:
    op.create_table(
        "live_run_counts",
        sa.Column("owner", sa.String(200), primary_key=True),
        sa.Column("slot", sa.SmallInteger(), primary_key=True),
        sa.Column("live", sa.Integer(), nullable=False),
    )
    if _postgresql():
        op.execute("LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE")
        op.execute(_PG_COUNT)
        op.execute(_PG_TRUNCATED)
        for name, event, condition in _EVENTS:
            op.execute(
                f"CREATE CONSTRAINT TRIGGER {name} AFTER {event} ON runs "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ({condition}) "
                "EXECUTE FUNCTION orch_count_live_run()"
            )
        op.execute(
            "CREATE TRIGGER runs_truncated AFTER TRUNCATE ON runs "
            "FOR EACH STATEMENT EXECUTE FUNCTION orch_forget_live_runs()"
        )
    else:
        for name, event, condition in _EVENTS:
            row, change = ("NEW", 1) if event == "INSERT" else ("OLD", -1)
            op.execute(
                f"CREATE TRIGGER {name} AFTER {event} ON runs WHEN {condition} BEGIN"
                + _SQLITE_ADD.format(row=row, change=change)
                + "END"
            )
    live = f"FROM runs WHERE parent_run_id IS NULL AND status IN {_LIVE}"
    op.execute(
        f"INSERT INTO live_run_counts (owner, slot, live) SELECT owner, 0, count(*) {live} "
        "GROUP BY owner"
    )
    op.execute(f"INSERT INTO live_run_counts (owner, slot, live) SELECT '', 0, count(*) {live}")


def downgrade() -> None:
    for name, _, _ in _EVENTS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}" + (" ON runs" if _postgresql() else ""))
    if _postgresql():
        op.execute("DROP TRIGGER IF EXISTS runs_truncated ON runs")
        op.execute("DROP FUNCTION IF EXISTS orch_count_live_run()")
        op.execute("DROP FUNCTION IF EXISTS orch_forget_live_runs()")
    op.drop_table("live_run_counts")


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"
