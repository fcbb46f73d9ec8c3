"""The one writer of status.

Every run and step status change goes through :func:`transition_run` or
:func:`transition_step`: a compare-and-set ``UPDATE … WHERE id = :id AND status = :seen`` that
also writes the journal row in the caller's transaction. A terminal status has no outgoing
transitions in :mod:`orchestration.states`, so no writer (a late worker, a zombie woken by
SIGCONT, a second beat) can move a run or a step out of it. Field updates that are not status
changes go through :func:`touch_run` / :func:`touch_step`, which are guarded the same way: they
only ever match a live row.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, Protocol, cast

from sqlalchemy import (
    ColumnElement,
    Insert,
    Table,
    Update,
    bindparam,
    exists,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ClauseElement

from orchestration.db import constant_in, on_postgresql
from orchestration.errors import IllegalTransition, RunNotFound
from orchestration.models import Run, RunEvent, Step
from orchestration.states import (
    RUN_LIVE,
    RUN_TERMINAL,
    RUN_TRANSITIONS,
    STEP_LIVE,
    STEP_TERMINAL,
    STEP_TRANSITIONS,
    STOP_REASONS,
    RunStatus,
    StepStatus,
    StopReason,
)

#: How many times a compare-and-set is retried after losing a race to another writer whose
#: change still leaves the target reachable (e.g. ``running`` → ``parked`` under us).
_CAS_TRIES = 5

_EVENTS = cast(Table, RunEvent.__table__)
#: The columns of a journal row (``run_events``), as every writer of one fills them.
JOURNALED = ("run_id", "step_id", "from_status", "to_status", "cause", "stop_reason", "at")
#: Built once: every transition writes one (binding is cheaper than building it again).
_JOURNAL = insert(_EVENTS).values({name: bindparam(name) for name in JOURNALED})
_TABLES: dict[str, Table] = {"runs": Run.__table__, "steps": Step.__table__}  # type: ignore[dict-item]
#: ``started_at`` is written only the first time a row starts running.
_FIRST_START = "started_at"


def _target(table_name: str, seen: Any) -> tuple[Table, ColumnElement[Any], ColumnElement[bool]]:
    """The table of a guarded write, its key column, and the guard: the status ``seen`` (a
    value or a bound parameter), or any live status when ``seen`` is ``None``."""
    table = _TABLES[table_name]
    key = table.c.id if table_name == "runs" else table.c.pk
    allowed = RUN_LIVE if table_name == "runs" else STEP_LIVE
    guard = constant_in(table.c.status, allowed) if seen is None else table.c.status == seen
    return table, key, guard


@functools.lru_cache(maxsize=256)
def _guarded(
    table_name: str,
    live: bool,
    columns: tuple[str, ...],
    first_start: bool,
    journaled: bool,
    run_columns: tuple[str, ...] = (),
) -> Update | Insert:
    """The compare-and-set ``UPDATE`` of ``columns`` on one row (``w_key``): on the status it
    was seen in (``w_seen``), or on any live status (``live``). Built once per shape, on the
    table: a status write then pays only for binding its values, not for building the
    statement, generating its cache key and the ORM's bulk-update bookkeeping.

    ``journaled`` (PostgreSQL): the update is a data-modifying CTE and the statement is the
    journal row's ``INSERT … SELECT … FROM moved RETURNING id``, so a transition is one round
    trip and the journal row exists exactly when the row moved. ``run_columns`` (with
    ``journaled``, a step's move): the step's run (``r_key``), if live, gets those columns
    (``r_…``) in the same statement, only when the step moved, as :func:`touch_run` would
    write them after it."""
    table, key, guard = _target(table_name, None if live else bindparam("w_seen"))
    sets: dict[str, ColumnElement[Any]] = {
        column: bindparam(f"v_{column}", type_=table.c[column].type) for column in columns
    }
    if first_start:
        sets[_FIRST_START] = func.coalesce(
            table.c.started_at, bindparam("v_first_start", type_=table.c.started_at.type)
        )
    moved = update(table).where(key == bindparam("w_key"), guard).values(sets)
    if not journaled:
        return moved
    cte = moved.returning(key).cte("moved")
    row = select(*(bindparam(f"j_{name}", type_=_EVENTS.c[name].type) for name in JOURNALED))
    journal = insert(_EVENTS).from_select(list(JOURNALED), row.select_from(cte))
    # The journal row's id says that the row moved: a row count of ``INSERT … SELECT`` under
    # a CTE is not reported (``-1``).
    journal = journal.add_cte(cte)
    if run_columns:
        runs, run_key, run_guard = _target("runs", None)
        touched = (
            update(runs)
            .where(run_key == bindparam("r_key"), run_guard, exists(select(1).select_from(cte)))
            .values({c: bindparam(f"r_{c}", type_=runs.c[c].type) for c in run_columns})
        )
        # PostgreSQL runs a data-modifying CTE to completion though nothing reads it.
        journal = journal.add_cte(touched.cte("touched"))
    return journal.returning(_EVENTS.c.id)


def _write(
    session: Session,
    table_name: str,
    key: object,
    values: Mapping[str, Any],
    *,
    seen: str | None = None,
    first_start: datetime | None = None,
    journal: Mapping[str, Any] | None = None,
    run_values: Mapping[str, Any] | None = None,
) -> int:
    """Run the guarded update of ``values`` and, if it matched, write the ``journal`` row
    and touch the step's run with ``run_values`` (see :func:`transition_step`); the number
    of rows it matched (0 or 1). A value that is an SQL expression is a caller's own: that
    write is built for the call."""
    if any(isinstance(value, ClauseElement) for value in values.values()):
        table, row, guard = _target(table_name, seen)
        written = dict(values)
        if first_start is not None:
            written.setdefault(_FIRST_START, func.coalesce(table.c.started_at, first_start))
        done = session.execute(update(table).where(row == key, guard).values(written))
        together = False
    else:
        first = first_start is not None and _FIRST_START not in values
        together = journal is not None and on_postgresql(session)
        params = {f"v_{column}": value for column, value in values.items()}
        params["w_key"] = key
        if seen is not None:
            params["w_seen"] = seen
        if first:
            params["v_first_start"] = first_start
        run_columns: tuple[str, ...] = ()
        if together:
            assert journal is not None
            params.update({f"j_{name}": value for name, value in journal.items()})
            if run_values is not None:
                run_set = {"updated_at": values["updated_at"], **run_values}
                run_columns = tuple(run_set)
                params["r_key"] = journal["run_id"]
                params.update({f"r_{name}": value for name, value in run_set.items()})
        statement = _guarded(table_name, seen is None, tuple(values), first, together, run_columns)
        done = session.execute(statement, params)
    if together:
        return len(done.all())
    matched = int(done.rowcount)  # type: ignore[attr-defined]
    if matched and journal is not None:
        session.execute(_JOURNAL, journal)
        if run_values is not None:
            touch_run(session, journal["run_id"], values["updated_at"], **run_values)
    return matched


def transition_run(
    session: Session,
    run_id: str,
    to: RunStatus,
    *,
    cause: str,
    now: datetime,
    stop_reason: StopReason | None = None,
    expect: Collection[RunStatus] | None = None,
    values: Mapping[str, Any] | None = None,
    seen: RunStatus | None = None,
) -> RunStatus:
    """Move run ``run_id`` to ``to`` and journal it; return the status it left.

    ``expect`` narrows the allowed sources further (e.g. only from ``parked``). ``values`` are
    other columns written in the same statement. ``seen`` is the status the caller read in
    this transaction (under the row's lock): the first compare-and-set is tried on it without
    reading the status again. A terminal ``to`` needs a ``stop_reason``
    allowed for it and sets ``finished_at``.

    Raises :class:`IllegalTransition` when the current status does not allow ``to`` (or not
    in ``expect``), and :class:`RunNotFound` when there is no such run.
    """
    if to in RUN_TERMINAL:
        if stop_reason not in STOP_REASONS[to]:
            raise ValueError(f"stop_reason {stop_reason!r} does not go with {to.value!r}")
    elif stop_reason is not None:
        raise ValueError("only a terminal status carries a stop_reason")
    row_values: dict[str, Any] = {"status": to.value, "updated_at": now, **(values or {})}
    if to in RUN_TERMINAL:
        row_values.update(
            stop_reason=stop_reason.value if stop_reason else None,
            finished_at=now,
            deadline_at=None,
            park_reason=None,
            parked_since=None,
            waiting_until=None,
        )
    first_start = now if to is RunStatus.RUNNING else None
    current: str | None = None
    for _ in range(_CAS_TRIES):
        if seen is None:
            current = session.execute(select(Run.status).where(Run.id == run_id)).scalar()
            if current is None:
                raise RunNotFound(run_id)
            seen = RunStatus(current)
        current = seen.value
        if to not in RUN_TRANSITIONS[seen] or (expect is not None and seen not in expect):
            raise IllegalTransition("run", run_id, current, to.value)
        journal = _journal(run_id, None, seen.value, to.value, cause, now, row_values)
        if _write(
            session,
            "runs",
            run_id,
            row_values,
            seen=seen.value,
            first_start=first_start,
            journal=journal,
        ):
            return seen
        seen = None
    raise IllegalTransition("run", run_id, current, to.value)


class StepKey(Protocol):
    """What a step write needs to name its row and journal it (a ``Step``, or what the
    execution's fence returned)."""

    @property
    def pk(self) -> int: ...
    @property
    def run_id(self) -> str: ...
    @property
    def step_id(self) -> str: ...


def transition_step(
    session: Session,
    step: StepKey,
    to: StepStatus,
    *,
    cause: str,
    now: datetime,
    expect: Collection[StepStatus] | None = None,
    values: Mapping[str, Any] | None = None,
    seen: StepStatus | None = None,
    run_values: Mapping[str, Any] | None = None,
) -> StepStatus:
    """Move ``step`` to ``to`` and journal it; return the status it left.

    The row is compared and set in SQL (``step`` is only used for its key, run and id); raises
    :class:`IllegalTransition` when the current status does not allow ``to``. ``seen`` as for
    :func:`transition_run`. ``run_values``: non-status columns of the step's run, written as
    :func:`touch_run` writes them once the step moved (on PostgreSQL in the move's statement:
    a step completed and its run moved on is one round trip)."""
    row_values: dict[str, Any] = {"status": to.value, "updated_at": now, **(values or {})}
    if to in STEP_TERMINAL:
        row_values.update(finished_at=now, next_poll_at=None)
    first_start = now if to is StepStatus.RUNNING else None
    current: str | None = None
    for _ in range(_CAS_TRIES):
        if seen is None:
            current = session.execute(select(Step.status).where(Step.pk == step.pk)).scalar()
            if current is None:
                raise IllegalTransition("step", step.step_id, None, to.value)
            seen = StepStatus(current)
        current = seen.value
        if to not in STEP_TRANSITIONS[seen] or (expect is not None and seen not in expect):
            raise IllegalTransition("step", f"{step.run_id}/{step.step_id}", current, to.value)
        journal = _journal(step.run_id, step.step_id, seen.value, to.value, cause, now, {})
        if _write(
            session,
            "steps",
            step.pk,
            row_values,
            seen=seen.value,
            first_start=first_start,
            journal=journal,
            run_values=run_values,
        ):
            return seen
        seen = None
    raise IllegalTransition("step", f"{step.run_id}/{step.step_id}", current, to.value)


def _journal(
    run_id: str,
    step_id: str | None,
    from_status: str,
    to_status: str,
    cause: str,
    now: datetime,
    values: Mapping[str, Any],
) -> dict[str, Any]:
    """The journal row of a transition, written in the same transaction as the move."""
    return {
        "run_id": run_id,
        "step_id": step_id,
        "from_status": from_status,
        "to_status": to_status,
        "cause": cause,
        "stop_reason": values.get("stop_reason"),
        "at": now,
    }


def touch_run(session: Session, run_id: str, now: datetime, **values: Any) -> bool:
    """Write non-status columns of a live run; ``False`` when the run is terminal (or gone)."""
    return _write(session, "runs", run_id, {"updated_at": now, **values}) == 1


def lock_run(session: Session, run_id: str, now: datetime) -> bool:
    """Take the run row's write lock for the rest of the transaction; ``False`` if terminal.

    An UPDATE, not ``SELECT … FOR UPDATE``: SQLite ignores the latter, and a step that is
    starting a provider turn holds this lock until the turn is recorded, so whoever takes it
    next sees the started step (and its turn to cancel).
    """
    return touch_run(session, run_id, now)


def touch_step(session: Session, step: StepKey, now: datetime, **values: Any) -> bool:
    """Write non-status columns of a live step; ``False`` when the step is terminal."""
    return _write(session, "steps", step.pk, {"updated_at": now, **values}) == 1
