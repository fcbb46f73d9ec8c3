"""Ending a run: the one function every terminal path calls.

A step's failure, a timeout, a park past its budget, ``cancel``, the sweeper and a displacing
claim all end a run through :func:`end_run`, in the caller's transaction. It moves the run and
its unfinished steps to their terminal statuses, records a stop for each provider turn that
may be live, passes the concurrency key to the next queued run, and returns what has to
happen after commit: the run's tasks revoked, the pending stops handed to the stop task, the
promoted run's first segment sent, its live branch runs ended, and (for a branch run) its
parent's branching step settled. No path can forget one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from orchestration.core.db import constant_in
from orchestration.core.errors import RunNotFound
from orchestration.core.followups import Followups
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import (
    RUN_LIVE,
    RUN_TERMINAL,
    STEP_END_FOR_RUN_END,
    STEP_LIVE,
    ConcurrencyState,
    RunStatus,
    StepStatus,
    StopReason,
    TurnStopStatus,
)
from orchestration.runs import chains, concurrency, turns
from orchestration.runs.transitions import take_run, transition_run, transition_step
from orchestration.workflows import decoded

_NOT_STARTED = {RunStatus.CANCELLED: StepStatus.CANCELLED}


def end_run(
    session: Session,
    settings: Settings,
    run_id: str,
    to: RunStatus,
    *,
    stop_reason: StopReason,
    cause: str,
    now: datetime,
    error: str | None = None,
    result: Any = None,
    result_sha256: str | None = None,
    step_error: str | None = None,
    extra: dict[str, Any] | None = None,
    promote: bool = True,
    revoke: bool = True,
    stops: Sequence[turns.Stopped] | None = None,
    stop_attempts: int = 0,
    stop_turns: bool = True,
) -> Followups:
    """Move the run to terminal ``to`` and each live step to its matching terminal status.

    Raises ``IllegalTransition`` if the run was already terminal (the caller lost a race and
    must not act further). ``revoke`` is false when the caller is the run's own step task
    (its chain stops with it). ``result`` is the last step's output as its row keeps it
    (``result_sha256`` set when that is an artifact's reference). ``stops`` are provider
    cancels already tried (``cancel`` tries each once inline); without them every live
    turn's stop is pending, unless ``stop_turns`` is false (the step ending its run saw its
    own turn end). The key passes to the next queued run unless ``promote`` is false (a
    displacing run takes it instead).
    """
    assert to in RUN_TERMINAL
    # The row lock first (an UPDATE: SQLite ignores FOR UPDATE), so the turns read below are
    # the ones a starting step recorded before it let the row go. An ended run is read as it
    # is, for the transition below to say why it cannot move.
    run = take_run(session, run_id, now) or session.get(
        Run, run_id, populate_existing=True, options=[defer(Run.workflow)]
    )
    if run is None:
        raise RunNotFound(run_id)
    # Only a holder's end frees its key. A run queued behind the holder releases nothing, and
    # must not lock the holder's row after its own: the holder's end locks the holder, then the
    # queued run it promotes, and the opposite order deadlocks with it (PostgreSQL).
    held = run.concurrency == ConcurrencyState.HOLDING
    task_ids = tuple(run.task_ids) if revoke else ()
    if stops is not None:
        tried = list(stops)
    else:
        tried = turns.pending(turns.live_turns(session, run)) if stop_turns else []
    values: dict[str, Any] = {"error": error, "concurrency": None, **(extra or {})}
    if result is not None:
        values["result"] = result
        values["result_sha256"] = result_sha256
    # Read under the lock: the compare-and-set is tried on it first (and reads again if it
    # lost the race).
    transition_run(
        session,
        run_id,
        to,
        cause=cause,
        now=now,
        stop_reason=stop_reason,
        values=values,
    )
    live_steps = session.scalars(
        select(Step)
        .where(Step.run_id == run_id, constant_in(Step.status, STEP_LIVE))
        .order_by(Step.index)
        # Transitions write SQL directly; objects already in this session may be stale.
        .execution_options(populate_existing=True)
    ).all()
    for step in live_steps:
        if step.status == StepStatus.PENDING:
            target = _NOT_STARTED.get(to, StepStatus.SKIPPED)
        else:
            target = STEP_END_FOR_RUN_END[to]
        step_values = (
            {"error": step_error} if step_error and target is not StepStatus.SKIPPED else {}
        )
        transition_step(session, step, target, cause=cause, now=now, values=step_values)
    for stopped in tried:
        turns.record(session, stopped, now, attempts=stop_attempts)
    then = Followups(
        revoke=task_ids,
        stops=tuple(
            (s.turn.run_id, s.turn.index) for s in tried if s.status is TurnStopStatus.PENDING
        ),
        ends=live_branches(session, run_id),
        joins=((run.parent_run_id, run.parent_step),)
        if run.parent_run_id is not None and run.parent_step is not None
        else (),
    )
    if promote and held and run.concurrency_key is not None:
        then += _promote(session, settings, run, now)
    return then


def live_branches(session: Session, run_id: str) -> tuple[str, ...]:
    """The branch runs still live under ``run_id``, in branch order (only a run with a
    branching step can have any; its specs are cached, so other runs pay no query)."""
    if not any(spec.branching for spec in decoded.of_run(session, run_id)):
        return ()
    return tuple(
        session.scalars(
            select(Run.id)
            .where(Run.parent_run_id == run_id, constant_in(Run.status, RUN_LIVE))
            .order_by(Run.parent_step, Run.branch)
        )
    )


def _promote(session: Session, settings: Settings, run: Run, now: datetime) -> Followups:
    """The holder ended: pass its key to the oldest queued run (its chain sent after commit)."""
    assert run.concurrency_key is not None
    waiting = concurrency.first_queued(session, run.owner, run.concurrency_key, lock=True)
    if waiting is None or concurrency.holder(session, run.owner, run.concurrency_key) is not None:
        return Followups()
    return chains.arm(session, settings, waiting, now=now, concurrency=ConcurrencyState.HOLDING)
