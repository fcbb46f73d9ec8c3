"""Guarded writes of runs and steps: a status change, or other columns of a live row.

A status change is one ``UPDATE … WHERE id = :id AND status IN (:sources)``, the sources
being those :mod:`orchestration.core.states` allows for the target (narrowed by the caller's
``expect``): a writer that lost a race to a move that still allows the target moves on from
there, one that lost to a terminal status writes nothing and learns why. The row carries
the change's ``cause``; the database's triggers (:mod:`orchestration.core.status_triggers`) check
the move once more and write its journal row, so this module builds no journal row. Other
columns are written by :func:`touch_run` / :func:`touch_step`, which only ever match a live
row.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import (
    ColumnElement,
    Executable,
    Table,
    Update,
    bindparam,
    func,
    select,
    update,
)
from sqlalchemy.orm import Session, defer
from sqlalchemy.sql.elements import ClauseElement

from orchestration.core import pieces
from orchestration.core.db import constant_in
from orchestration.core.errors import IllegalTransition, RunNotFound
from orchestration.core.models import Run, Step
from orchestration.core.states import (
    RUN_LIVE,
    RUN_TERMINAL,
    STEP_LIVE,
    STEP_TERMINAL,
    STOP_REASONS,
    RunStatus,
    StepStatus,
    StopReason,
    run_sources,
    step_sources,
)

_TABLES: dict[str, Table] = {"runs": Run.__table__, "steps": Step.__table__}  # type: ignore[dict-item]
#: ``started_at`` is written only the first time a row starts running.
_FIRST_START = "started_at"


def _key(table: Table) -> ColumnElement[Any]:
    return table.c.id if table.name == "runs" else table.c.pk


def _guard(table: Table, key: Any, sources: frozenset[str]) -> tuple[ColumnElement[bool], ...]:
    """Every guarded write's ``WHERE``: the row ``key``, only while its status is one of
    ``sources``."""
    return (_key(table) == key, constant_in(table.c.status, sources))


@functools.lru_cache(maxsize=256)
def guarded(
    table_name: str,
    sources: frozenset[str],
    columns: tuple[str, ...],
    first_start: bool,
) -> Update:
    """The guarded ``UPDATE`` of ``columns`` (bound as ``v_COLUMN``) on the row ``w_key``,
    only while its status is one of ``sources``, returning its key. Built once per shape:
    a write pays for binding its values, not for building the statement."""
    table = _TABLES[table_name]
    sets: dict[str, ColumnElement[Any]] = {
        column: bindparam(f"v_{column}", type_=table.c[column].type) for column in columns
    }
    if first_start:
        sets[_FIRST_START] = func.coalesce(
            table.c.started_at, bindparam("v_first_start", type_=table.c.started_at.type)
        )
    return (
        update(table)
        .where(*_guard(table, bindparam("w_key"), sources))
        .values(sets)
        .returning(_key(table))
    )


def _params(key: object, values: Mapping[str, Any], first_start: datetime | None) -> dict[str, Any]:
    params = {f"v_{column}": value for column, value in values.items()}
    params["w_key"] = key
    if first_start is not None:
        params["v_first_start"] = first_start
    return params


def _write(
    session: Session,
    table_name: str,
    key: object,
    values: Mapping[str, Any],
    sources: frozenset[str],
    *,
    first_start: datetime | None = None,
) -> bool:
    """Run the guarded update of ``values``; whether it matched the row. A value that is an
    SQL expression is a caller's own: that write is built for the call."""
    first = first_start is not None and _FIRST_START not in values
    if any(isinstance(value, ClauseElement) for value in values.values()):
        table = _TABLES[table_name]
        written = dict(values)
        if first:
            written[_FIRST_START] = func.coalesce(table.c.started_at, first_start)
        own = (
            update(table).where(*_guard(table, key, sources)).values(written).returning(_key(table))
        )
        return session.execute(own).first() is not None
    statement = guarded(table_name, sources, tuple(values), first)
    return (
        session.execute(statement, _params(key, values, first_start if first else None)).first()
        is not None
    )


def _allowed(sources: frozenset[Any], expect: Collection[Any] | None) -> frozenset[str]:
    narrowed = sources if expect is None else sources & frozenset(expect)
    return frozenset(status.value for status in narrowed)


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
) -> None:
    """Move run ``run_id`` to ``to`` for ``cause`` (the database journals it).

    ``expect`` narrows the allowed sources further (e.g. only from ``parked``). ``values`` are
    other columns written in the same statement. A terminal ``to`` needs a ``stop_reason``
    allowed for it and sets ``finished_at``.

    Raises :class:`IllegalTransition` when the current status does not allow ``to`` (or is
    not in ``expect``), and :class:`RunNotFound` when there is no such run.
    """
    if to in RUN_TERMINAL:
        if stop_reason not in STOP_REASONS[to]:
            raise ValueError(f"stop_reason {stop_reason!r} does not go with {to.value!r}")
    elif stop_reason is not None:
        raise ValueError("only a terminal status carries a stop_reason")
    row_values: dict[str, Any] = {
        "status": to.value,
        "cause": cause,
        "updated_at": now,
        **(values or {}),
    }
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
    sources = _allowed(run_sources(to), expect)
    if not _write(session, "runs", run_id, row_values, sources, first_start=first_start):
        current = session.scalar(select(Run.status).where(Run.id == run_id))
        if current is None:
            raise RunNotFound(run_id)
        raise IllegalTransition("run", run_id, str(current), to.value)


class StepKey(Protocol):
    """What a step write needs to name its row (a ``Step``, or what the execution's fence
    returned)."""

    @property
    def pk(self) -> int: ...
    @property
    def run_id(self) -> str: ...
    @property
    def step_id(self) -> str: ...


def step_move(
    to: StepStatus,
    columns: tuple[str, ...],
    *,
    expect: frozenset[StepStatus] | None = None,
) -> Update:
    """The guarded ``UPDATE`` that moves a step to ``to`` with ``columns`` (``v_…``; the
    status, cause and times among them), as :func:`transition_step` sends it: a piece that
    other pieces (its run's touch) may follow."""
    first = to is StepStatus.RUNNING and _FIRST_START not in columns
    return guarded("steps", _allowed(step_sources(to), expect), columns, first)


@functools.lru_cache(maxsize=64)
def _run_touch(columns: tuple[str, ...]) -> Update:
    runs = _TABLES["runs"]
    return (
        update(runs)
        .where(runs.c.id == bindparam("r_key"), constant_in(runs.c.status, _names(RUN_LIVE)))
        .values({c: bindparam(f"r_{c}", type_=runs.c[c].type) for c in columns})
        .returning(runs.c.id)
    )


@functools.lru_cache(maxsize=64)
def _move_pieces(
    to: StepStatus,
    columns: tuple[str, ...],
    expect: frozenset[StepStatus] | None,
    run_columns: tuple[str, ...] | None,
) -> tuple[pieces.Piece, ...]:
    """A step's move, and its run's touch when ``run_columns``, as pieces built once per
    shape: :func:`pieces.send` composes a tuple of pieces once, and knows it by identity."""
    move = pieces.Piece("moved", step_move(to, columns, expect=expect))
    if run_columns is None:
        return (move,)
    return move, pieces.Piece("touched", _run_touch(run_columns), after="moved")


def _names(statuses: frozenset[Any]) -> frozenset[str]:
    return frozenset(status.value for status in statuses)


def transition_step(
    session: Session,
    step: StepKey,
    to: StepStatus,
    *,
    cause: str,
    now: datetime,
    expect: Collection[StepStatus] | None = None,
    values: Mapping[str, Any] | None = None,
    run_values: Mapping[str, Any] | None = None,
) -> None:
    """Move ``step`` to ``to`` for ``cause`` (the database journals it).

    The row is compared and set in SQL (``step`` is only used for its key, run and id); raises
    :class:`IllegalTransition` when the current status does not allow ``to``. ``run_values``:
    non-status columns of the step's run, written as :func:`touch_run` writes them once the
    step moved, as a piece after the move (:mod:`orchestration.core.pieces`: on PostgreSQL, a step
    completed and its run moved on is one statement)."""
    row_values: dict[str, Any] = {
        "status": to.value,
        "cause": cause,
        "updated_at": now,
        **(values or {}),
    }
    if to in STEP_TERMINAL:
        row_values.update(finished_at=now, next_poll_at=None)
    first_start = now if to is StepStatus.RUNNING and _FIRST_START not in row_values else None
    allowed = frozenset(expect) if expect is not None else None
    if any(isinstance(value, ClauseElement) for value in row_values.values()):
        moved = _write(
            session,
            "steps",
            step.pk,
            row_values,
            _allowed(step_sources(to), allowed),
            first_start=first_start,
        )
        if moved and run_values is not None:
            touch_run(session, step.run_id, now, **run_values)
    else:
        params = _params(step.pk, row_values, first_start)
        run_columns: tuple[str, ...] | None = None
        if run_values is not None:
            run_set = {"updated_at": now, **run_values}
            params["r_key"] = step.run_id
            params.update({f"r_{name}": value for name, value in run_set.items()})
            run_columns = tuple(run_set)
        sent = _move_pieces(to, tuple(row_values), allowed, run_columns)
        moved = pieces.send(session, sent, params)["moved"] is not None
    if not moved:
        current = session.scalar(select(Step.status).where(Step.pk == step.pk))
        shown = None if current is None else str(current)
        raise IllegalTransition("step", f"{step.run_id}/{step.step_id}", shown, to.value)


def touch_run(session: Session, run_id: str, now: datetime, **values: Any) -> bool:
    """Write non-status columns of a live run; ``False`` when the run is terminal (or gone)."""
    return _write(session, "runs", run_id, {"updated_at": now, **values}, _names(RUN_LIVE))


def lock_run(session: Session, run_id: str, now: datetime) -> bool:
    """Take the run row's write lock for the rest of the transaction; ``False`` if terminal.

    An UPDATE, not ``SELECT … FOR UPDATE``: SQLite ignores the latter, and a step that is
    starting a provider turn holds this lock until the turn is recorded, so whoever takes it
    next sees the started step (and its turn to cancel).
    """
    return touch_run(session, run_id, now)


@functools.lru_cache(maxsize=16)
def _taking(firsts: tuple[str, ...]) -> Executable:
    """The statement of :func:`take_run` writing ``firsts``; built once per shape, as
    :func:`guarded` is (building it at each call cost more than the round trip it saves)."""
    table = _TABLES["runs"]
    sets: dict[str, ColumnElement[Any]] = {
        "updated_at": bindparam("v_updated_at", type_=table.c.updated_at.type)
    }
    for column in firsts:
        bound = bindparam(f"v_{column}", type_=table.c[column].type)
        sets[column] = func.coalesce(table.c[column], bound)
    taken = (
        update(table)
        .where(*_guard(table, bindparam("w_key"), _names(RUN_LIVE)))
        .values(sets)
        .returning(*(column for column in table.c if column.name != "workflow"))
    )
    return select(Run).from_statement(taken).options(defer(Run.workflow))


def take_run(session: Session, run_id: str, now: datetime, **firsts: datetime) -> Run | None:
    """:func:`lock_run` and the run as written, in one statement: the lock and the read its
    taker makes next, in one round trip (the workflow deferred). Each of ``firsts`` is
    written where it is unset. ``None`` when the run is terminal or gone."""
    params = {"w_key": run_id, "v_updated_at": now}
    params.update({f"v_{column}": value for column, value in firsts.items()})
    taken = _taking(tuple(sorted(firsts)))
    run: Run | None = session.scalars(
        taken, params, execution_options={"populate_existing": True}
    ).first()
    return run


def touch_step(session: Session, step: StepKey, now: datetime, **values: Any) -> bool:
    """Write non-status columns of a live step; ``False`` when the step is terminal."""
    return _write(session, "steps", step.pk, {"updated_at": now, **values}, _names(STEP_LIVE))
