"""Approval steps: a person's decision, or the expiry, settles the step once.

An approval step calls no provider. Its execution renders the prompt and parks the run
(``approval``, ``waiting_until`` = its ``expires_in``) and halts: no worker waits. A decision
(``approve``) or the sweeper at the expiry locks the run row and settles the step, and
whichever commits first wins; the other finds the run no longer parked for it and gets a
:class:`ConflictError`. The step's output is ``{decision, by, comment, at}``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core import health
from orchestration.core.errors import ConflictError, ValidationError
from orchestration.core.followups import Done, Followups
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import ParkReason, RunStatus, StepStatus, StopReason
from orchestration.execution import finishing, parking
from orchestration.execution.outcomes import Halt, Outcome
from orchestration.limits import suspensions
from orchestration.runs import artifacts, closing, effects
from orchestration.runs.transitions import lock_run, touch_step, transition_step
from orchestration.workflows import decoded
from orchestration.workflows.steps import OnExpiry, StepSpec

_SETTLED = effects.Progress(settled=True, exhausted=[], next_due=None)
#: The longest comment a decision keeps (the CLI, the API and the dashboard take it).
MAX_COMMENT_CHARS = 2000


def ask(
    session: Session,
    settings: Settings,
    run: Run,
    step: Step,
    spec: StepSpec,
    prompt: Any,
    now: datetime,
) -> Done[Outcome]:
    """Park the run (already moved out of ``queued`` by the claim) for a decision on
    ``prompt`` until the approval expires."""
    assert spec.approval is not None
    if step.status == StepStatus.PENDING:
        transition_step(
            session,
            step,
            StepStatus.RUNNING,
            cause="approval requested",
            now=now,
            values={"input": prompt},
        )
    expires = now + timedelta(seconds=spec.approval.expires_in)
    parking.park(
        session, settings, run, step, ParkReason.APPROVAL, now, waiting_until=expires, prompt=prompt
    )
    return Done(Halt("waiting for a decision"))


def decide(
    session: Session,
    settings: Settings,
    run_id: str,
    step_id: str,
    *,
    approve: bool,
    comment: str | None,
    by: str,
    now: datetime,
) -> Followups:
    """Record a person's decision on the approval step ``step_id`` and move the run on (or
    end it ``failed``, ``approval_rejected``)."""
    run, step = _parked(session, run_id, step_id, now)
    if approve:  # an approval starts new work; a rejection only ends the run
        suspensions.refuse(session, run.owner)
    assert run.waiting_until is not None
    if now >= run.waiting_until:
        raise ConflictError(
            f"the approval of step {step_id!r} expired at "
            f"{run.waiting_until.isoformat(timespec='seconds')}"
        )
    decision = "approved" if approve else "rejected"
    return _settle(
        session,
        settings,
        run,
        step,
        now,
        output={"decision": decision, "by": by, "comment": comment, "at": now.isoformat()},
        go_on=approve,
        stop=StopReason.APPROVAL_REJECTED,
    )


def expire(session: Session, settings: Settings, run_id: str, now: datetime) -> Followups | None:
    """The sweeper at the expiry: apply the step's ``on_expiry``; ``None`` when the run is no
    longer waiting on an expired approval (a decision committed first)."""
    lock_run(session, run_id, now)
    run = session.get(Run, run_id, populate_existing=True)
    judged = health.judge(session, settings, run_id, now)
    if run is None or judged is None or not judged.approval_expired:
        return None
    step = session.scalars(
        select(Step).where(Step.run_id == run.id, Step.index == run.current_step)
    ).one()
    spec = decoded.of_run(session, run.id)[step.index]
    assert spec.approval is not None
    on = spec.approval.on_expiry
    return _settle(
        session,
        settings,
        run,
        step,
        now,
        output={
            "decision": "expired",
            "by": None,
            "comment": None,
            "at": now.isoformat(),
            "applied": on.value,
        },
        go_on=on is OnExpiry.APPROVE,
        stop=StopReason.APPROVAL_REJECTED if on is OnExpiry.REJECT else StopReason.APPROVAL_EXPIRED,
    )


def _parked(session: Session, run_id: str, step_id: str, now: datetime) -> tuple[Run, Step]:
    """The run, locked, and its approval step, refusing anything not waiting for a decision."""
    step = session.scalars(
        select(Step).where(Step.run_id == run_id, Step.step_id == step_id)
    ).first()
    if step is None:
        raise ValidationError("step", f"run {run_id} has no step {step_id!r}")
    spec = decoded.of_run(session, run_id)[step.index]
    if spec.approval is None:
        raise ValidationError("step", f"step {step_id!r} is not an approval step")
    locked = lock_run(session, run_id, now)
    run = session.get(Run, run_id, populate_existing=True)
    session.refresh(step)
    assert run is not None
    waiting = (
        locked
        and run.status == RunStatus.PARKED
        and run.park_reason == ParkReason.APPROVAL
        and run.current_step == step.index
        and step.status == StepStatus.PARKED
        and run.cancel_requested_at is None
    )
    if not waiting:
        said = (step.output or {}).get("decision") if isinstance(step.output, dict) else None
        raise ConflictError(
            f"run {run_id} is {run.status}, not waiting for a decision at step {step_id!r}"
            + (f" (it was {said})" if said else "")
        )
    return run, step


def _settle(
    session: Session,
    settings: Settings,
    run: Run,
    step: Step,
    now: datetime,
    *,
    output: dict[str, Any],
    go_on: bool,
    stop: StopReason,
) -> Followups:
    if go_on:
        parking.unpark(session, run, step, now)
        return finishing.complete(
            session,
            settings,
            run,
            step,
            artifacts.Kept(output),
            _SETTLED,
            now,
            steps=len(decoded.of_run(session, run.id)),
            chained=False,
            values={"output": output, "prompt": None},
        ).then
    touch_step(session, step, now, output=output)
    said = output["decision"] + (f" by {output['by']}" if output.get("by") else "")
    comment = f": {output['comment']}" if output.get("comment") else ""
    return closing.end_run(
        session,
        settings,
        run.id,
        RunStatus.FAILED,
        stop_reason=stop,
        cause=f"approval {said}",
        now=now,
        error=f"step {step.step_id}: {said}{comment}",
        step_error=f"{said}{comment}",
        revoke=False,
        stop_turns=False,
    )
