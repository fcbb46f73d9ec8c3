"""A human's answer to a step parked ``input_required``: the step's next attempt resumes with it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core.errors import ConflictError, ValidationError
from orchestration.core.followups import Done
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import ParkReason, RunStatus, StepStatus
from orchestration.limits import suspensions
from orchestration.runs import chains, new_rows
from orchestration.runs.transitions import touch_run, transition_run, transition_step


def resume(
    session: Session, settings: Settings, run: Run, step_id: str, value: Any, now: datetime
) -> Done[None]:
    """Start the next attempt of ``run``'s step ``step_id`` with ``value`` as its answer.

    Raises :class:`OwnerSuspended` for a suspended owner, :class:`ValidationError` for an
    unknown step and :class:`ConflictError` unless the run is parked for a human at that
    step with no cancel requested (checked under the row lock, so a cancel or the park's
    expiry that commits first wins)."""
    run_id = run.id
    suspensions.refuse(session, run.owner)
    step = session.scalars(
        select(Step).where(Step.run_id == run_id, Step.step_id == step_id)
    ).first()
    if step is None:
        raise ValidationError("step", f"run {run_id} has no step {step_id!r}")
    # Lock the row, then check: only a run parked for a human with no cancel resumes.
    locked = touch_run(session, run_id, now)
    session.refresh(run)
    session.refresh(step)
    if not locked or not (
        run.status == RunStatus.PARKED
        and run.park_reason == ParkReason.HUMAN
        and step.status == StepStatus.PARKED
        and run.cancel_requested_at is None
    ):
        raise ConflictError(
            f"run {run_id} is {run.status}, not waiting for an answer at step {step_id!r}"
        )
    attempt = step.attempt + 1
    transition_step(
        session,
        step,
        StepStatus.RUNNING,
        cause="answered by a human",
        now=now,
        values={
            "attempt": attempt,
            "answer": value,
            # The turn that asked: a runtime that names it only by its own ids (MCP) finds
            # it through this, the next attempt's key being new.
            "asked_turn": {"key": step.idempotency_key, "provider_run_id": step.provider_run_id},
            "prompt": None,
            "provider_run_id": None,
            "idempotency_key": new_rows.idempotency_key(run_id, step_id, attempt),
            "started_at": now,
            "error": None,
        },
    )
    transition_run(
        session,
        run_id,
        RunStatus.RUNNING,
        cause=f"answered at step {step_id}",
        now=now,
        values={"park_reason": None, "parked_since": None, "waiting_until": None},
    )
    return Done(None, chains.arm(session, settings, run, now=now))
