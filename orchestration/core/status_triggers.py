"""The database's own guard of the state machine: triggers generated from ``states``' tables.

Every status a row is written in passes through one place, whichever statement writes it
(a guarded transition, a fast path's data-modifying CTE, a launch's insert): a trigger on
``runs`` and one on ``steps`` refuse a new row in a status it cannot start in and a change
the transition table does not allow, and write the change's journal row (``run_events``)
from the row itself. The writer names the change's cause in the row's ``cause`` column; the
journal copies it, with the status left, the status reached and the row's ``updated_at``.

A migration passes the tables it was generated from (:class:`Machine`), frozen in its file,
so that an old migration keeps creating what it created; ``tests/unit/test_status_triggers``
checks that the newest one holds the tables of :mod:`orchestration.core.states`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from sqlalchemy import Connection, text

from orchestration.core import states

E = TypeVar("E", bound=StrEnum)

#: The one SQLSTATE the triggers raise (``check_violation``): a driver reports it as an
#: integrity error, never as an outage worth retrying.
REFUSED = "23514"


@dataclass(frozen=True)
class Machine:
    """The tables a trigger is generated from: for each table (``runs``, ``steps``), the
    allowed moves, the statuses a new row may have, and the one new status not journaled."""

    run_moves: Mapping[str, tuple[str, ...]]
    step_moves: Mapping[str, tuple[str, ...]]
    run_initial: tuple[str, ...]
    step_initial: tuple[str, ...]
    step_silent: str


def current() -> Machine:
    """The tables of :mod:`orchestration.core.states` as they are now."""
    return Machine(
        run_moves=_moves(states.RUN_TRANSITIONS),
        step_moves=_moves(states.STEP_TRANSITIONS),
        run_initial=_sorted(states.RUN_INITIAL),
        step_initial=_sorted(states.STEP_INITIAL),
        step_silent=states.STEP_SILENT_INITIAL.value,
    )


def _sorted(values: Iterable[StrEnum]) -> tuple[str, ...]:
    return tuple(sorted(value.value for value in values))


def _moves(table: Mapping[E, frozenset[E]]) -> dict[str, tuple[str, ...]]:
    return {source.value: _sorted(targets) for source, targets in table.items()}


@dataclass(frozen=True)
class _Table:
    name: str
    kind: str
    run_id: str
    step_id: str
    stop_reason: str
    moves: Mapping[str, tuple[str, ...]]
    initial: tuple[str, ...]
    silent: str | None


def _tables(machine: Machine) -> tuple[_Table, _Table]:
    runs = _Table(
        name="runs",
        kind="run",
        run_id="NEW.id",
        step_id="NULL",
        stop_reason="NEW.stop_reason",
        moves=machine.run_moves,
        initial=machine.run_initial,
        silent=None,
    )
    steps = _Table(
        name="steps",
        kind="step",
        run_id="NEW.run_id",
        step_id="NEW.step_id",
        stop_reason="NULL",
        moves=machine.step_moves,
        initial=machine.step_initial,
        silent=machine.step_silent,
    )
    return runs, steps


def _pairs(moves: Mapping[str, tuple[str, ...]]) -> str:
    return ", ".join(f"('{src}', '{dst}')" for src, dsts in sorted(moves.items()) for dst in dsts)


def _names(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def _journal(table: _Table, from_status: str) -> str:
    return (
        "INSERT INTO run_events (run_id, step_id, from_status, to_status, cause, stop_reason, at)"
        f" VALUES ({table.run_id}, {table.step_id}, {from_status}, NEW.status, NEW.cause,"
        f" {table.stop_reason}, NEW.updated_at);"
    )


def postgresql(machine: Machine) -> list[str]:
    """The functions and triggers, as PostgreSQL statements."""
    statements = []
    for table in _tables(machine):
        function = f"orch_journal_{table.kind}"
        statements.append(f"""
CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.cause IS NULL THEN
        RAISE EXCEPTION 'a {table.kind} status is written without a cause'
            USING ERRCODE = '{REFUSED}';
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.status NOT IN ({_names(table.initial)}) THEN
            RAISE EXCEPTION 'a new {table.kind} cannot be %', NEW.status
                USING ERRCODE = '{REFUSED}';
        END IF;
        {_journal(table, "NULL")}
    ELSE
        IF (OLD.status, NEW.status) NOT IN ({_pairs(table.moves)}) THEN
            RAISE EXCEPTION 'illegal {table.kind} transition % -> %', OLD.status, NEW.status
                USING ERRCODE = '{REFUSED}';
        END IF;
        {_journal(table, "OLD.status")}
    END IF;
    RETURN NULL;
END
$$""")
        inserted = f" WHEN (NEW.status <> '{table.silent}')" if table.silent else ""
        statements.append(
            f"CREATE TRIGGER {table.name}_journal_inserted AFTER INSERT ON {table.name} "
            f"FOR EACH ROW{inserted} EXECUTE FUNCTION {function}()"
        )
        statements.append(
            f"CREATE TRIGGER {table.name}_journal_moved AFTER UPDATE OF status ON {table.name} "
            "FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) "
            f"EXECUTE FUNCTION {function}()"
        )
    return statements


def sqlite(machine: Machine) -> list[str]:
    """The triggers, as SQLite statements (``RAISE(ABORT, …)`` rolls the statement back)."""
    statements = []
    for table in _tables(machine):
        uncaused = (
            f"SELECT RAISE(ABORT, 'a {table.kind} status is written without a cause') "
            "WHERE NEW.cause IS NULL;"
        )
        silent = f" AND NEW.status <> '{table.silent}'" if table.silent else ""
        statements.append(
            f"CREATE TRIGGER {table.name}_journal_inserted AFTER INSERT ON {table.name} "
            f"WHEN 1{silent} BEGIN {uncaused} "
            f"SELECT RAISE(ABORT, 'a new {table.kind} cannot start in that status') "
            f"WHERE NEW.status NOT IN ({_names(table.initial)}); "
            f"{_journal(table, 'NULL')} END"
        )
        statements.append(
            f"CREATE TRIGGER {table.name}_journal_moved AFTER UPDATE OF status ON {table.name} "
            f"WHEN OLD.status IS NOT NEW.status BEGIN {uncaused} "
            f"SELECT RAISE(ABORT, 'illegal {table.kind} transition') "
            f"WHERE (OLD.status, NEW.status) NOT IN (VALUES {_pairs(table.moves)}); "
            f"{_journal(table, 'OLD.status')} END"
        )
    return statements


_TRIGGERS = tuple(
    (table, f"{table}_journal_{event}")
    for table in ("runs", "steps")
    for event in ("inserted", "moved")
)


def dropped(dialect: str) -> list[str]:
    """What :func:`postgresql` or :func:`sqlite` created, dropped."""
    postgres = dialect == "postgresql"
    statements = [
        f"DROP TRIGGER IF EXISTS {name}" + (f" ON {table}" if postgres else "")
        for table, name in _TRIGGERS
    ]
    if postgres:
        statements += ["DROP FUNCTION IF EXISTS orch_journal_run()"]
        statements += ["DROP FUNCTION IF EXISTS orch_journal_step()"]
    return statements


@contextmanager
def suspended(connection: Connection) -> Iterator[None]:
    """The guard and the journal off for the rest of ``connection``'s transaction, to load
    rows written elsewhere into any status with their own journal (a restore, a benchmark's
    history, a test's scaffolding). The engine never calls it. DDL in a transaction: on
    PostgreSQL it locks both tables until the commit, on SQLite the triggers are dropped and
    created again."""
    postgres = connection.dialect.name == "postgresql"
    lookup = (
        "SELECT 1 FROM pg_trigger WHERE tgname = :name"
        if postgres
        else "SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = :name"
    )
    present = [
        (table, name)
        for table, name in _TRIGGERS
        if connection.execute(text(lookup), {"name": name}).first() is not None
    ]
    for table, name in present:
        off = f"ALTER TABLE {table} DISABLE TRIGGER {name}" if postgres else f"DROP TRIGGER {name}"
        connection.execute(text(off))
    yield
    if postgres:
        # Deferred triggers (the live runs' counts) must fire before a table is altered.
        connection.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))
        for table, name in present:
            connection.execute(text(f"ALTER TABLE {table} ENABLE TRIGGER {name}"))
    elif present:
        for statement in sqlite(current()):
            connection.execute(text(statement))
