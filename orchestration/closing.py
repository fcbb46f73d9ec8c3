"""Ending a run: the run and its unfinished steps in one transaction, and its claim released.

Every terminal path (a step, ``cancel``, the sweeper, a displacing claim) ends a run here, so
that none of them can forget the steps or the concurrency key's next run.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration import claims
from orchestration.dispatch import Dispatcher
from orchestration.models import Run, Step
from orchestration.settings import Settings
from orchestration.states import (
    RUN_TERMINAL,
    STEP_END_FOR_RUN_END,
    STEP_LIVE,
    RunStatus,
    StepStatus,
    StopReason,
)
from orchestration.transitions import transition_run, transition_step

_NOT_STARTED = {RunStatus.CANCELLED: StepStatus.CANCELLED}


def close_run(
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
    step_error: str | None = None,
    extra: dict[str, Any] | None = None,
    dispatcher: Dispatcher | None,
    promote: bool = True,
) -> RunStatus:
    """Move the run to terminal ``to`` and each live step to its matching terminal status.

    Returns the status the run left; raises ``IllegalTransition`` if it was already terminal
    (the caller lost a race and must not act further). The run's concurrency claim passes to
    the next queued run unless ``promote`` is false (a displacing run takes it instead).
    """
    assert to in RUN_TERMINAL
    # Only a holder's end frees its key. A run queued behind the holder releases nothing, and
    # must not lock the holder's row after its own: the holder's end locks the holder, then the
    # queued run it promotes, and the opposite order deadlocks with it (PostgreSQL).
    held = (
        session.scalar(select(Run.claim).where(Run.id == run_id).with_for_update())
        == claims.HOLDING
    )
    values: dict[str, Any] = {"error": error, "claim": None, **(extra or {})}
    if result is not None:
        values["result"] = result
    left = transition_run(
        session, run_id, to, cause=cause, now=now, stop_reason=stop_reason, values=values
    )
    live_steps = session.scalars(
        select(Step)
        .where(Step.run_id == run_id, Step.status.in_([s.value for s in STEP_LIVE]))
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
    claims.release(
        session, settings, run_id, now=now, dispatcher=dispatcher, promote=promote and held
    )
    return left
