"""Locking a run and its step for an execution's write, and ending a run from a step."""

from __future__ import annotations

import functools
from collections.abc import Collection
from datetime import datetime

from sqlalchemy import Update, bindparam, select, update
from sqlalchemy.orm import Session, defer

from orchestration import bounds, closing
from orchestration.db import constant_in
from orchestration.followups import Followups
from orchestration.models import Run, Step
from orchestration.settings import Settings
from orchestration.states import STEP_TERMINAL, RunStatus, StopReason

STARTABLE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.PARKED)
MOVABLE = (*STARTABLE, RunStatus.WAITING)


@functools.lru_cache(maxsize=8)
def _lock(statuses: tuple[str, ...]) -> Update:
    """Lock and read the run in one statement (the workflow column stays behind: specs are
    cached by run), built once per set of statuses."""
    return (
        update(Run)
        .where(
            Run.id == bindparam("run"),
            constant_in(Run.status, statuses),
            Run.cancel_requested_at.is_(None),
        )
        .values(heartbeat_at=bindparam("now"))
        .returning(Run)
        .options(defer(Run.workflow))
        .execution_options(populate_existing=True, synchronize_session=False)
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
    locking = _lock(tuple(status.value for status in statuses))
    run = session.scalars(locking, {"run": run_id, "now": now}).first()
    if run is None:
        raise Moved
    step = step_of(session, run_id, index)
    assert step is not None
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
