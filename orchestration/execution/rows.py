"""Locking a run and its step for an execution's write, and ending a run from a step."""

from __future__ import annotations

import functools
from collections.abc import Collection
from datetime import datetime
from typing import TypeVar

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session, make_transient_to_detached

from orchestration.core import pieces
from orchestration.core.db import constant_in
from orchestration.core.followups import Followups
from orchestration.core.models import Run, Step
from orchestration.core.pieces import Piece
from orchestration.core.settings import Settings
from orchestration.core.states import STEP_TERMINAL, RunStatus, StopReason
from orchestration.execution.fence import STARTABLE as STARTABLE
from orchestration.limits import bounds
from orchestration.runs import closing

MOVABLE = (*STARTABLE, RunStatus.WAITING)
R = TypeVar("R", Run, Step)


_RUNS: Table = Run.__table__  # type: ignore[assignment]
_STEPS: Table = Step.__table__  # type: ignore[assignment]
#: Every run column but the workflow (specs are cached by run), as the lock returns them.
_RUN_COLUMNS = tuple(column for column in _RUNS.c if column.key != "workflow")


@functools.lru_cache(maxsize=8)
def _lock(statuses: tuple[str, ...]) -> tuple[Piece, Piece]:
    """Lock and read the run, then read its step ``b_index`` with the lock its update takes
    anyway (``FOR NO KEY UPDATE``, after the run's): as one statement, a locking read returns
    the step's latest committed version, not the statement's snapshot, so a write committed
    under the run lock while this one waited (a newer fence's) is seen."""
    locked = (
        update(_RUNS)
        .where(
            _RUNS.c.id == bindparam("b_run"),
            constant_in(_RUNS.c.status, statuses),
            _RUNS.c.cancel_requested_at.is_(None),
        )
        .values(heartbeat_at=bindparam("b_now"))
        .returning(*_RUN_COLUMNS)
    )
    step = (
        select(_STEPS)
        .where(_STEPS.c.run_id == bindparam("b_run"), _STEPS.c.index == bindparam("b_index"))
        .with_for_update(key_share=True)
    )
    return Piece("run", locked), Piece("step", step, after="run")


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
    :class:`Moved` otherwise. The rows come back as the session's objects."""
    names = tuple(sorted(status.value for status in statuses))
    sent = pieces.send(session, _lock(names), {"b_run": run_id, "b_now": now, "b_index": index})
    run_row, step_row = sent["run"], sent["step"]
    if run_row is None or step_row is None:
        raise Moved
    run = _loaded(session, Run(**run_row))
    step = _loaded(session, Step(**step_row))
    if step.status in STEP_TERMINAL or step.polls != tick:
        raise Moved
    return run, step


def _loaded(session: Session, row: R) -> R:
    """``row``, built from the columns a statement returned, as the session's own object
    (as a query would have loaded it: a column it was not given is read when used)."""
    make_transient_to_detached(row)
    return session.merge(row, load=False)


_STEP = (
    select(Step)
    .where(Step.run_id == bindparam("run"), Step.index == bindparam("index"))
    .execution_options(populate_existing=True)
)


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
    reason: StopReason | None = None,
) -> Followups:
    """Fail the run from its own step; ``over`` when a value did not fit its bound
    (``over_limit``), or for ``reason``. The error is redacted and bounded first: it may
    quote a provider."""
    text = bounds.error_text(error, settings)
    return closing.end_run(
        session,
        settings,
        run_id,
        RunStatus.FAILED,
        stop_reason=reason or (StopReason.OVER_LIMIT if over else StopReason.STEP_FAILED),
        cause="a value did not fit its bound" if over else "step failed",
        now=now,
        error=text,
        step_error=text,
        revoke=False,
        stop_turns=False,
    )
