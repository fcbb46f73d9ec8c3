"""inline output bytes: each owner's outputs kept in their steps' rows, counted by triggers

``ORCH_MAX_STORED_BYTES_PER_OWNER`` counted the owner's artifacts only: an output small
enough to stay in its step's row (``steps.output`` with ``output_sha256`` NULL) was not
counted, so many kept runs' small outputs were unbounded. Now triggers on ``steps`` keep the
bytes of each owner's inline outputs (the length of the output's JSON as the database stores
it) in ``inline_output_bytes``: a step written with an inline output adds its size, one whose
output changes adds the change, one deleted takes its size away. An artifact's reference is
not counted here (the artifact is, in ``artifacts``). The owner is the step's run's. The
stored JSON is each database's own: PostgreSQL's ``jsonb`` text, SQLite's the text written
(where a non-ASCII character is an escape), so the two may count one output differently.

On PostgreSQL, as for the live runs' counts (0014), a write adds to the slot of its
connection (``pg_backend_pid() % 16``), deferred to the commit, after locking its slot's row
of all owners' live runs (the order every count trigger takes its rows in). A deleted step is
counted at once, while its run's row is there to name the owner; a run's delete takes away its
steps' bytes first (its steps then go by the foreign key's cascade, finding no run, and count
nothing); and a delete of steps or runs first counts the writes of its transaction still
deferred. SQLite counts at once, in one row per owner. The bytes of the steps already there
are counted under a lock that keeps steps and runs from being written meanwhile.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

#: An inline output: an output in the row that is not an artifact's reference. A step with
#: no output holds SQL ``NULL`` or JSON ``null`` (the models write ``None`` as JSON): neither
#: counts. ``{null}`` is JSON ``null`` as the dialect compares it.
_INLINE = "{row}.output IS NOT NULL AND {row}.output <> {null} AND {row}.output_sha256 IS NULL"
_PG_NULL = "'null'::jsonb"
_SQLITE_NULL = "'null'"


def _written(null: str) -> tuple[tuple[str, str, str], ...]:
    """The triggers a write of a step's output fires, deferred on PostgreSQL: (name, event,
    condition). An update fires only when the output or its reference changes."""
    return (
        ("steps_output_inserted", "INSERT", _INLINE.format(row="NEW", null=null)),
        (
            "steps_output_changed",
            "UPDATE OF output, output_sha256",
            "OLD.output IS DISTINCT FROM NEW.output "
            "OR OLD.output_sha256 IS DISTINCT FROM NEW.output_sha256",
        ),
    )


_PG_SIZE = (
    f"CASE WHEN {_INLINE.replace('{null}', _PG_NULL)} "
    "THEN octet_length({row}.output::text) ELSE 0 END"
)

_PG_COUNT = f"""
CREATE FUNCTION orch_count_inline_output() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_owner varchar;
    v_change bigint := 0;
    v_run varchar;
    v_slot smallint := pg_backend_pid() % 16;
BEGIN
    IF TG_OP = 'DELETE' THEN
        v_run := OLD.run_id;
        v_change := -({_PG_SIZE.format(row="OLD")});
    ELSE
        v_run := NEW.run_id;
        v_change := {_PG_SIZE.format(row="NEW")};
        IF TG_OP = 'UPDATE' THEN
            v_change := v_change - ({_PG_SIZE.format(row="OLD")});
        END IF;
    END IF;
    IF v_change = 0 THEN
        RETURN NULL;
    END IF;
    SELECT owner INTO v_owner FROM runs WHERE id = v_run;
    IF v_owner IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM live_run_counts WHERE owner = '' AND slot = v_slot FOR NO KEY UPDATE;
    INSERT INTO inline_output_bytes (owner, slot, bytes) VALUES (v_owner, v_slot, v_change)
    ON CONFLICT (owner, slot) DO UPDATE SET bytes = inline_output_bytes.bytes + EXCLUDED.bytes;
    RETURN NULL;
END
$$
"""

_PG_RUN_DELETED = f"""
CREATE FUNCTION orch_uncount_run_outputs() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_bytes bigint;
BEGIN
    SELECT sum({_PG_SIZE.format(row="steps")}) INTO v_bytes FROM steps WHERE run_id = OLD.id;
    IF v_bytes > 0 THEN
        INSERT INTO inline_output_bytes (owner, slot, bytes)
        VALUES (OLD.owner, pg_backend_pid() % 16, -v_bytes)
        ON CONFLICT (owner, slot) DO UPDATE
        SET bytes = inline_output_bytes.bytes + EXCLUDED.bytes;
    END IF;
    RETURN OLD;
END
$$
"""

_PG_FLUSH = """
CREATE FUNCTION orch_count_pending_outputs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SET CONSTRAINTS steps_output_inserted, steps_output_changed IMMEDIATE;
    SET CONSTRAINTS steps_output_inserted, steps_output_changed DEFERRED;
    RETURN NULL;
END
$$
"""

_PG_TRUNCATED = """
CREATE FUNCTION orch_forget_inline_outputs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM inline_output_bytes;
    RETURN NULL;
END
$$
"""

#: PostgreSQL's triggers besides :func:`_written`'s: (name, table), for the downgrade.
_PG_OTHERS = (
    ("steps_output_deleted", "steps"),
    ("runs_outputs_deleted", "runs"),
    ("steps_pending_outputs_counted", "steps"),
    ("runs_pending_outputs_counted", "runs"),
    ("steps_truncated", "steps"),
)
_PG_FUNCTIONS = (
    "orch_count_inline_output",
    "orch_uncount_run_outputs",
    "orch_count_pending_outputs",
    "orch_forget_inline_outputs",
)

_SQLITE_SIZE = (
    f"CASE WHEN {_INLINE.replace('{null}', _SQLITE_NULL)} "
    "THEN length(CAST({row}.output AS BLOB)) ELSE 0 END"
)
_SQLITE_ADD = """
INSERT INTO inline_output_bytes (owner, slot, bytes)
SELECT owner, 0, {change} FROM runs WHERE id = {row}.run_id AND {change} <> 0
ON CONFLICT (owner, slot) DO UPDATE SET bytes = bytes + excluded.bytes;
"""
_SQLITE = {
    "steps_output_inserted": (
        "AFTER INSERT ON steps",
        _INLINE.format(row="NEW", null=_SQLITE_NULL),
        "NEW",
        "{new}",
    ),
    "steps_output_changed": (
        "AFTER UPDATE OF output, output_sha256 ON steps",
        "OLD.output IS NOT NEW.output OR OLD.output_sha256 IS NOT NEW.output_sha256",
        "NEW",
        "{new} - {old}",
    ),
    "steps_output_deleted": (
        "AFTER DELETE ON steps",
        _INLINE.format(row="OLD", null=_SQLITE_NULL),
        "OLD",
        "-{old}",
    ),
}
_SQLITE_RUN_DELETED = f"""
CREATE TRIGGER runs_outputs_deleted BEFORE DELETE ON runs BEGIN
INSERT INTO inline_output_bytes (owner, slot, bytes)
SELECT OLD.owner, 0, -sum({_SQLITE_SIZE.format(row="steps")}) FROM steps WHERE run_id = OLD.id
HAVING sum({_SQLITE_SIZE.format(row="steps")}) > 0
ON CONFLICT (owner, slot) DO UPDATE SET bytes = bytes + excluded.bytes;
END
"""


def upgrade() -> None:
    op.create_table(
        "inline_output_bytes",
        sa.Column("owner", sa.String(200), primary_key=True),
        sa.Column("slot", sa.SmallInteger(), primary_key=True),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
    )
    size = _PG_SIZE if _postgresql() else _SQLITE_SIZE
    if _postgresql():
        op.execute("LOCK TABLE runs, steps IN SHARE ROW EXCLUSIVE MODE")
        for function in (_PG_COUNT, _PG_RUN_DELETED, _PG_FLUSH, _PG_TRUNCATED):
            op.execute(function)
        for name, event, condition in _written(_PG_NULL):
            op.execute(
                f"CREATE CONSTRAINT TRIGGER {name} AFTER {event} ON steps "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ({condition}) "
                "EXECUTE FUNCTION orch_count_inline_output()"
            )
        op.execute(
            "CREATE TRIGGER steps_output_deleted AFTER DELETE ON steps "
            f"FOR EACH ROW WHEN ({_INLINE.format(row='OLD', null=_PG_NULL)}) "
            "EXECUTE FUNCTION orch_count_inline_output()"
        )
        op.execute(
            "CREATE TRIGGER runs_outputs_deleted BEFORE DELETE ON runs "
            "FOR EACH ROW EXECUTE FUNCTION orch_uncount_run_outputs()"
        )
        for table in ("steps", "runs"):
            op.execute(
                f"CREATE TRIGGER {table}_pending_outputs_counted BEFORE DELETE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION orch_count_pending_outputs()"
            )
        op.execute(
            "CREATE TRIGGER steps_truncated AFTER TRUNCATE ON steps "
            "FOR EACH STATEMENT EXECUTE FUNCTION orch_forget_inline_outputs()"
        )
    else:
        for name, (event, condition, row, change) in _SQLITE.items():
            sized = change.format(
                new=_SQLITE_SIZE.format(row="NEW"), old=f"({_SQLITE_SIZE.format(row='OLD')})"
            )
            op.execute(
                f"CREATE TRIGGER {name} {event} WHEN {condition} BEGIN"
                + _SQLITE_ADD.format(row=row, change=f"({sized})")
                + "END"
            )
        op.execute(_SQLITE_RUN_DELETED)
    null = _PG_NULL if _postgresql() else _SQLITE_NULL
    op.execute(
        "INSERT INTO inline_output_bytes (owner, slot, bytes) "
        f"SELECT runs.owner, 0, sum({size.format(row='steps')}) "
        "FROM steps JOIN runs ON runs.id = steps.run_id "
        f"WHERE {_INLINE.format(row='steps', null=null)} GROUP BY runs.owner"
    )


def downgrade() -> None:
    postgres = _postgresql()
    names = [(name, "steps") for name, _, _ in _written(_PG_NULL)] + (
        list(_PG_OTHERS)
        if postgres
        else [("steps_output_deleted", "steps"), ("runs_outputs_deleted", "runs")]
    )
    for name, table in names:
        op.execute(f"DROP TRIGGER IF EXISTS {name}" + (f" ON {table}" if postgres else ""))
    if postgres:
        for function in _PG_FUNCTIONS:
            op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    op.drop_table("inline_output_bytes")


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"
