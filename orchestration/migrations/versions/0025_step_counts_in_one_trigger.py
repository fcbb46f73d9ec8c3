"""step counts in one trigger: a step's write counts its live turn and its inline bytes at once

On PostgreSQL, 0024's live turns and 0023's inline bytes were each kept by deferred triggers
of their own on ``steps``: a step that finished (its turn ended and its output written by
one ``UPDATE``) fired both at the commit, and each looked up the run's owner and locked its
slot's row of all owners' live runs. Now one deferred trigger per write of a step
(``steps_counted_inserted``, ``steps_counted_changed``) works out both changes, looks up
the owner and takes the slot's row once, and adds to each count that changed, in the same
order as before. A delete of steps or runs counts its transaction's pending writes first,
as before, through one flush of the new triggers. SQLite counts at once, in triggers of its
own (0023, 0024); they are left as they are.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def _turn(row: str) -> str:
    """``row`` (``NEW`` or ``OLD``) is a live turn (0024)."""
    return (
        f"({row}.status = 'running' AND "
        f"({row}.provider_run_id IS NOT NULL OR {row}.start_claimed_at IS NOT NULL))"
    )


def _inline(row: str) -> str:
    """``row`` holds an inline output: one in the row that is not an artifact's reference
    (0023)."""
    return (
        f"({row}.output IS NOT NULL AND {row}.output <> 'null'::jsonb "
        f"AND {row}.output_sha256 IS NULL)"
    )


def _size(row: str) -> str:
    return f"CASE WHEN {_inline(row)} THEN octet_length({row}.output::text) ELSE 0 END"


_COUNT = f"""
CREATE FUNCTION orch_count_step() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_turns integer := CASE WHEN {_turn("NEW")} THEN 1 ELSE 0 END;
    v_bytes bigint := {_size("NEW")};
    v_owner varchar;
    v_slot smallint := pg_backend_pid() % 16;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        v_turns := v_turns - CASE WHEN {_turn("OLD")} THEN 1 ELSE 0 END;
        v_bytes := v_bytes - ({_size("OLD")});
    END IF;
    IF v_turns = 0 AND v_bytes = 0 THEN
        RETURN NULL;
    END IF;
    SELECT owner INTO v_owner FROM runs WHERE id = NEW.run_id;
    IF v_owner IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM live_run_counts WHERE owner = '' AND slot = v_slot FOR NO KEY UPDATE;
    IF v_turns <> 0 THEN
        INSERT INTO live_turn_counts (owner, slot, live) VALUES (v_owner, v_slot, v_turns)
        ON CONFLICT (owner, slot) DO UPDATE SET live = live_turn_counts.live + EXCLUDED.live;
    END IF;
    IF v_bytes <> 0 THEN
        INSERT INTO inline_output_bytes (owner, slot, bytes) VALUES (v_owner, v_slot, v_bytes)
        ON CONFLICT (owner, slot) DO UPDATE
        SET bytes = inline_output_bytes.bytes + EXCLUDED.bytes;
    END IF;
    RETURN NULL;
END
$$
"""

#: (trigger, event, condition): a write of a step that may change its owner's counts.
_COUNTED = (
    ("steps_counted_inserted", "INSERT", f"{_turn('NEW')} OR {_inline('NEW')}"),
    (
        "steps_counted_changed",
        "UPDATE OF status, provider_run_id, start_claimed_at, output, output_sha256",
        f"{_turn('OLD')} <> {_turn('NEW')} OR OLD.output IS DISTINCT FROM NEW.output "
        "OR OLD.output_sha256 IS DISTINCT FROM NEW.output_sha256",
    ),
)

#: 0024's and 0023's deferred triggers, in their functions: (trigger, event, condition).
_SEPARATE = {
    "orch_count_live_turn": (
        ("steps_turn_inserted", "INSERT", _turn("NEW")),
        (
            "steps_turn_changed",
            "UPDATE OF status, provider_run_id, start_claimed_at",
            f"{_turn('OLD')} <> {_turn('NEW')}",
        ),
    ),
    "orch_count_inline_output": (
        ("steps_output_inserted", "INSERT", _inline("NEW")),
        (
            "steps_output_changed",
            "UPDATE OF output, output_sha256",
            "OLD.output IS DISTINCT FROM NEW.output "
            "OR OLD.output_sha256 IS DISTINCT FROM NEW.output_sha256",
        ),
    ),
}

#: 0024's turn counter, which only its two triggers used (0023's serves a step's delete too).
_PG_COUNT_TURN = f"""
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


def _flush(function: str, triggers: str) -> str:
    """A flush that fires ``triggers``' pending events of this transaction, before a delete."""
    return f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SET CONSTRAINTS {triggers} IMMEDIATE;
    SET CONSTRAINTS {triggers} DEFERRED;
    RETURN NULL;
END
$$
"""


def _deferred(name: str, event: str, condition: str, function: str) -> str:
    return (
        f"CREATE CONSTRAINT TRIGGER {name} AFTER {event} ON steps "
        f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ({condition}) "
        f"EXECUTE FUNCTION {function}()"
    )


def upgrade() -> None:
    if not _postgresql():
        return
    op.execute("LOCK TABLE runs, steps IN SHARE ROW EXCLUSIVE MODE")
    for triggers in _SEPARATE.values():
        for name, _, _ in triggers:
            op.execute(f"DROP TRIGGER {name} ON steps")
    op.execute("DROP TRIGGER runs_pending_turns_counted ON runs")
    op.execute("DROP FUNCTION orch_count_pending_turns()")
    op.execute("DROP FUNCTION orch_count_live_turn()")
    op.execute(_COUNT)
    for name, event, condition in _COUNTED:
        op.execute(_deferred(name, event, condition, "orch_count_step"))
    op.execute(
        _flush("orch_count_pending_outputs", "steps_counted_inserted, steps_counted_changed")
    )


def downgrade() -> None:
    if not _postgresql():
        return
    op.execute("LOCK TABLE runs, steps IN SHARE ROW EXCLUSIVE MODE")
    for name, _, _ in _COUNTED:
        op.execute(f"DROP TRIGGER {name} ON steps")
    op.execute("DROP FUNCTION orch_count_step()")
    op.execute(_PG_COUNT_TURN)
    for function, triggers in _SEPARATE.items():
        for name, event, condition in triggers:
            op.execute(_deferred(name, event, condition, function))
    op.execute(_flush("orch_count_pending_outputs", "steps_output_inserted, steps_output_changed"))
    op.execute(_flush("orch_count_pending_turns", "steps_turn_inserted, steps_turn_changed"))
    op.execute(
        "CREATE TRIGGER runs_pending_turns_counted BEFORE DELETE ON runs "
        "FOR EACH STATEMENT EXECUTE FUNCTION orch_count_pending_turns()"
    )


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"
