"""live turn counts: kept by triggers on steps, so that admission reads a few rows

An owner's live provider turns (``ORCH_MAX_LIVE_TURNS_PER_OWNER``) were counted at every
launch and every start claim by joining the owner's live runs to their steps: the cost grew
with the owner's live runs. The count is now rows that triggers keep, as
0014 keeps the live runs': a step that becomes a live turn (``running`` with a turn or a start
claimed) adds one to its run's owner's count, one that stops being one takes one away. On
PostgreSQL the triggers are deferred to the commit and add to the connection's slot
(``pg_backend_pid() % 16``), after locking that slot's row of all owners' live runs (the order
every count trigger takes its rows in, so that count triggers never deadlock); on SQLite there
is one row per owner. Steps are deleted only with their run: a live run deleted takes its
steps' live turns away before it goes (a terminal run has none), once its transaction's
deferred counts are in. The counts of the turns already there are written under a lock that keeps steps
from being written meanwhile.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_LIVE = "('cancelling', 'parked', 'queued', 'running', 'waiting')"


def _turn(row: str) -> str:
    """``row`` (``NEW``, ``OLD`` or a table) is a live turn."""
    return (
        f"({row}.status = 'running' AND "
        f"({row}.provider_run_id IS NOT NULL OR {row}.start_claimed_at IS NOT NULL))"
    )


_PG_COUNT = f"""
CREATE FUNCTION orch_count_live_turn() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_owner varchar;
    v_change integer := CASE WHEN {_turn("NEW")} THEN 1 ELSE -1 END;
    v_slot smallint := pg_backend_pid() % 16;
BEGIN
    SELECT owner INTO v_owner FROM runs WHERE id = NEW.run_id;
    IF v_owner IS NOT NULL THEN
        PERFORM 1 FROM live_run_counts WHERE owner = '' AND slot = v_slot FOR NO KEY UPDATE;
        INSERT INTO live_turn_counts (owner, slot, live) VALUES (v_owner, v_slot, v_change)
        ON CONFLICT (owner, slot) DO UPDATE SET live = live_turn_counts.live + EXCLUDED.live;
    END IF;
    RETURN NULL;
END
$$
"""

_PG_RUN_DELETED = f"""
CREATE FUNCTION orch_forget_run_turns() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_turns integer;
BEGIN
    SELECT count(*) INTO v_turns FROM steps WHERE run_id = OLD.id AND {_turn("steps")};
    IF v_turns > 0 THEN
        INSERT INTO live_turn_counts (owner, slot, live)
        VALUES (OLD.owner, pg_backend_pid() % 16, -v_turns)
        ON CONFLICT (owner, slot) DO UPDATE SET live = live_turn_counts.live + EXCLUDED.live;
    END IF;
    RETURN OLD;
END
$$
"""

_PG_FLUSH = """
CREATE FUNCTION orch_count_pending_turns() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SET CONSTRAINTS steps_turn_inserted, steps_turn_changed IMMEDIATE;
    SET CONSTRAINTS steps_turn_inserted, steps_turn_changed DEFERRED;
    RETURN NULL;
END
$$
"""

_PG_TRUNCATED = """
CREATE FUNCTION orch_forget_live_turns() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM live_turn_counts;
    RETURN NULL;
END
$$
"""

#: (trigger, event, condition, change on SQLite): a step that becomes a live turn, or stops
#: being one.
_EVENTS = (
    ("steps_turn_inserted", "INSERT", _turn("NEW"), "1"),
    (
        "steps_turn_changed",
        "UPDATE OF status, provider_run_id, start_claimed_at",
        f"{_turn('OLD')} <> {_turn('NEW')}",
        f"CASE WHEN {_turn('NEW')} THEN 1 ELSE -1 END",
    ),
)

_PG_FUNCTIONS = (
    "orch_count_live_turn",
    "orch_forget_run_turns",
    "orch_count_pending_turns",
    "orch_forget_live_turns",
)

_SQLITE_ADD = """
INSERT INTO live_turn_counts (owner, slot, live)
SELECT owner, 0, {change} FROM runs WHERE id = NEW.run_id
ON CONFLICT (owner, slot) DO UPDATE SET live = live + excluded.live;
"""

_SQLITE_RUN_DELETED = f"""
CREATE TRIGGER runs_turns_deleted BEFORE DELETE ON runs WHEN OLD.status IN {_LIVE} BEGIN
INSERT INTO live_turn_counts (owner, slot, live)
SELECT OLD.owner, 0, -count(*) FROM steps WHERE run_id = OLD.id AND {_turn("steps")}
HAVING count(*) > 0
ON CONFLICT (owner, slot) DO UPDATE SET live = live + excluded.live;
END
"""


def upgrade() -> None:
    op.create_table(
        "live_turn_counts",
        sa.Column("owner", sa.String(200), primary_key=True),
        sa.Column("slot", sa.SmallInteger(), primary_key=True),
        sa.Column("live", sa.Integer(), nullable=False),
    )
    if _postgresql():
        op.execute("LOCK TABLE steps IN SHARE ROW EXCLUSIVE MODE")
        op.execute(_PG_COUNT)
        op.execute(_PG_RUN_DELETED)
        op.execute(_PG_FLUSH)
        op.execute(_PG_TRUNCATED)
        for name, event, condition, _ in _EVENTS:
            op.execute(
                f"CREATE CONSTRAINT TRIGGER {name} AFTER {event} ON steps "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ({condition}) "
                "EXECUTE FUNCTION orch_count_live_turn()"
            )
        op.execute(
            "CREATE TRIGGER runs_pending_turns_counted BEFORE DELETE ON runs "
            "FOR EACH STATEMENT EXECUTE FUNCTION orch_count_pending_turns()"
        )
        op.execute(
            "CREATE TRIGGER runs_turns_deleted BEFORE DELETE ON runs FOR EACH ROW "
            f"WHEN (OLD.status IN {_LIVE}) EXECUTE FUNCTION orch_forget_run_turns()"
        )
        for table in ("runs", "steps"):
            op.execute(
                f"CREATE TRIGGER {table}_turns_truncated AFTER TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION orch_forget_live_turns()"
            )
    else:
        for name, event, condition, change in _EVENTS:
            op.execute(
                f"CREATE TRIGGER {name} AFTER {event} ON steps WHEN {condition} BEGIN"
                + _SQLITE_ADD.format(change=change)
                + "END"
            )
        op.execute(_SQLITE_RUN_DELETED)
    op.execute(
        "INSERT INTO live_turn_counts (owner, slot, live) SELECT runs.owner, 0, count(*) "
        f"FROM steps JOIN runs ON runs.id = steps.run_id WHERE {_turn('steps')} "
        "GROUP BY runs.owner"
    )


def downgrade() -> None:
    on = " ON steps" if _postgresql() else ""
    for name, _, _, _ in _EVENTS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}{on}")
    op.execute("DROP TRIGGER IF EXISTS runs_turns_deleted" + (" ON runs" if _postgresql() else ""))
    if _postgresql():
        op.execute("DROP TRIGGER IF EXISTS runs_pending_turns_counted ON runs")
        for table in ("runs", "steps"):
            op.execute(f"DROP TRIGGER IF EXISTS {table}_turns_truncated ON {table}")
        for function in _PG_FUNCTIONS:
            op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    op.drop_table("live_turn_counts")


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"
