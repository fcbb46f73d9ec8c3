"""Parks from a step: entering, leaving, and running past their budget or the step timeout."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from orchestration.core import deadlines, health
from orchestration.core.followups import Followups
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import ParkReason, RunStatus, StepStatus, StopReason
from orchestration.runs import closing
from orchestration.runs.transitions import touch_run, transition_run, transition_step
from orchestration.workflows.steps import StepSpec


def park(
    session: Session,
    settings: Settings,
    run: Run,
    step: Step,
    reason: ParkReason,
    now: datetime,
    *,
    waiting_until: datetime | None = None,
    prompt: Any = None,
) -> None:
    """Park the run and its step for ``reason``, stating the park's deadline."""
    session.refresh(run)
    session.refresh(step)
    if step.status == StepStatus.RUNNING:
        transition_step(
            session,
            step,
            StepStatus.PARKED,
            cause=f"parked: {reason.value}",
            now=now,
            values={"prompt": prompt},
        )
    parked_since = run.parked_since if run.status == RunStatus.PARKED else now
    deadline = deadlines.compute(
        settings,
        RunStatus.PARKED,
        heartbeat_at=now,
        park_reason=reason.value,
        parked_since=parked_since,
        waiting_until=waiting_until,
    )
    values = {"park_reason": reason.value, "waiting_until": waiting_until, "deadline_at": deadline}
    if run.status == RunStatus.PARKED:
        touch_run(session, run.id, now, **values)
    else:
        transition_run(
            session,
            run.id,
            RunStatus.PARKED,
            cause=f"parked: {reason.value}",
            now=now,
            values={**values, "parked_since": now},
        )
    session.refresh(run)


def unpark(session: Session, run: Run, step: Step, now: datetime) -> None:
    """Move a parked run and step back to running (``run`` and ``step`` as this transaction
    locked and read them)."""
    changed = False
    if step.status == StepStatus.PARKED:
        transition_step(session, step, StepStatus.RUNNING, cause="resumed", now=now)
        changed = True
    if run.status == RunStatus.PARKED:
        leave_park(session, run.id, now, cause=f"resumed from {run.park_reason} park")
        changed = True
    if changed:
        # Transitions write SQL directly: bring the objects up to date for the caller.
        session.refresh(run)
        session.refresh(step)


def leave_park(session: Session, run_id: str, now: datetime, *, cause: str) -> None:
    """Move a parked run back to running, its park cleared."""
    transition_run(
        session,
        run_id,
        RunStatus.RUNNING,
        cause=cause,
        now=now,
        values={"park_reason": None, "parked_since": None, "waiting_until": None},
    )


def expire(session: Session, settings: Settings, run: Run, now: datetime) -> Followups | None:
    """End the run if its park ran past its budget; ``None`` if it has not."""
    session.refresh(run)
    judged = health.judge(session, settings, run.id, now)
    if judged is None or not judged.park_expired:
        return None
    return closing.end_run(
        session,
        settings,
        run.id,
        RunStatus.TIMED_OUT,
        stop_reason=StopReason.PARK_EXPIRED,
        cause=f"{run.park_reason} park ran past its budget",
        now=now,
        error=f"parked ({run.park_reason}) past its budget",
        revoke=False,
    )


def time_out(
    session: Session, settings: Settings, run: Run, step: Step, now: datetime
) -> Followups:
    """End the run: its step ran past its timeout (the turn is stopped after commit)."""
    return closing.end_run(
        session,
        settings,
        run.id,
        RunStatus.TIMED_OUT,
        stop_reason=StopReason.STEP_TIMEOUT,
        cause=f"step {step.step_id} ran past its timeout",
        now=now,
        error=f"step {step.step_id} timed out",
        revoke=False,
    )


def bounded(countdown: float, timeout_at: datetime | None, now: datetime) -> float:
    """Never sleep past the step's timeout: the timeout is seen at the next execution."""
    if timeout_at is None:
        return countdown
    return max(0.0, min(countdown, (timeout_at - now).total_seconds() + 0.05))


def next_poll(spec: StepSpec, started_at: datetime | None, tick: int, now: datetime) -> float:
    """The countdown to the next poll of a step at ``tick``: the backoff, cut to the timeout."""
    timeout_at = deadlines.step_timeout_at(started_at, spec.timeout)
    return bounded(backoff(spec, tick), timeout_at, now)


def backoff(spec: StepSpec, tick: int) -> float:
    """``poll_interval`` for the first poll, doubling up to ``max_poll_interval``."""
    return float(min(spec.max_poll_interval, spec.poll_interval * 2 ** min(max(tick - 2, 0), 16)))
