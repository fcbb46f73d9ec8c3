"""Locking a run and its step for an execution's write, and ending a run from a step."""

from __future__ import annotations

import functools
from collections.abc import Collection
from datetime import datetime

from sqlalchemy import ColumnElement, Select, Table, Update, and_, bindparam, select, update
from sqlalchemy.orm import Session, aliased, defer

from orchestration import bounds, closing
from orchestration.db import constant_in, on_postgresql
from orchestration.followups import Followups
from orchestration.models import Run, Step
from orchestration.settings import Settings
from orchestration.states import STEP_TERMINAL, RunStatus, StopReason

STARTABLE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.PARKED)
MOVABLE = (*STARTABLE, RunStatus.WAITING)


_RUNS: Table = Run.__table__  # type: ignore[assignment]


def _writable(statuses: tuple[str, ...]) -> tuple[ColumnElement[bool], ...]:
    """The run an execution may write: ``run``, in one of ``statuses``, no cancel requested
    (the guard of both forms of the lock)."""
    return (
        Run.id == bindparam("run"),
        constant_in(Run.status, statuses),
        Run.cancel_requested_at.is_(None),
    )


@functools.lru_cache(maxsize=8)
def _lock(statuses: tuple[str, ...]) -> Update:
    """Lock and read the run in one statement (the workflow column stays behind: specs are
    cached by run), built once per set of statuses."""
    return (
        update(Run)
        .where(*_writable(statuses))
        .values(heartbeat_at=bindparam("now"))
        .returning(Run)
        .options(defer(Run.workflow))
        .execution_options(populate_existing=True, synchronize_session=False)
    )


@functools.lru_cache(maxsize=8)
def _lock_with_step(statuses: tuple[str, ...]) -> Select[Run, Step]:
    """:func:`_lock` and the step's read in one statement (PostgreSQL: a data-modifying CTE).

    The step is read ``FOR NO KEY UPDATE`` (the lock its update takes anyway), after the
    run's lock: the statement's snapshot was taken before any wait for the run row, and a
    locking read returns the step's latest committed version, not the snapshot's, so a write
    committed under the run lock meanwhile (a newer fence's) is seen, as the separate read
    after the lock saw it."""
    locked = (
        update(_RUNS)
        .where(*_writable(statuses))
        .values(heartbeat_at=bindparam("now"))
        .returning(*(column for column in _RUNS.c if column.key != "workflow"))
        .cte("locked")
    )
    run = aliased(Run, locked)
    return (
        select(run, Step)
        .join(Step, and_(Step.run_id == run.id, Step.index == bindparam("index")))
        .with_for_update(of=Step, key_share=True)
        .execution_options(populate_existing=True)
    )


_STEP = (
    select(Step)
    .where(Step.run_id == bindparam("run"), Step.index == bindparam("index"))
    .execution_options(populate_existing=True)
)


class Moved(Exception):
    """The run row refused this execution's write: a cancel is requested, the run ended or
    left the statuses the write expects, or a newer execution fenced the step."""


def lock(
    session: Session,
    run_id: str,
    index: int,
    tick: int,
    now: datetime,
    statuses: Collection[RunStatus],
) -> tuple[Run, Step]:
    """Lock the run row for this execution's write, only while the run is in ``statuses``
    with no cancel requested, the step is live, and no newer execution has fenced the step
    since (a worker woken from SIGSTOP must not write over its successor); raise
    :class:`Moved` otherwise."""
    names = tuple(status.value for status in statuses)
    bound = {"run": run_id, "now": now, "index": index}
    if on_postgresql(session):
        found = session.execute(_lock_with_step(names), bound).first()
        if found is None:
            raise Moved
        run, step = found
    else:
        locked = session.scalars(_lock(names), bound).first()
        if locked is None:
            raise Moved
        read = step_of(session, run_id, index)
        assert read is not None
        run, step = locked, read
    if step.status in STEP_TERMINAL or step.polls != tick:
        raise Moved
    return run, step


def step_of(session: Session, run_id: str, index: int) -> Step | None:
    """The step row as it is now (transitions write SQL directly)."""
    return session.scalars(_STEP, {"run": run_id, "index": index}).first()


def fail(
    session: Session,
    settings: Settings,
    run_id: str,
    error: str,
    now: datetime,
    *,
    over: bool = False,
) -> Followups:
    """Fail the run from its own step; ``over`` when a value did not fit its bound
    (``over_limit``). The error is redacted and bounded first: it may quote a provider."""
    text = bounds.error_text(error, settings)
    return closing.end_run(
        session,
        settings,
        run_id,
        RunStatus.FAILED,
        stop_reason=StopReason.OVER_LIMIT if over else StopReason.STEP_FAILED,
        cause="a value did not fit its bound" if over else "step failed",
        now=now,
        error=text,
        step_error=text,
        revoke=False,
        stop_turns=False,
    )
