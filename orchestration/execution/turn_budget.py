"""A start held back by its owner's live-turn budget (``ORCH_MAX_LIVE_TURNS_PER_OWNER``).

The start claim refuses a step whose owner has as many live provider turns as its budget
(:data:`fence.Refusal.TURNS`, the last refusal :func:`fence.refusal` judges). The step waits:
its task retries on a countdown, no lock held and no provider called, and its row says why
(``last_provider_status``, which ``explain`` words), until one of the owner's turns ends.
The wait is bounded: past ``ORCH_MAX_LIVE_TURN_WAIT`` from when the step could first start,
the run fails ``over_limit`` naming the budget, so a run never hangs on another's turns.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestration.core.errors import LimitExceeded
from orchestration.core.followups import Done
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import StepStatus
from orchestration.execution.entry import Entry
from orchestration.execution.outcomes import Halt, Outcome, Poll
from orchestration.execution.rows import fail
from orchestration.limits import admission
from orchestration.runs.transitions import touch_step

#: What a held step's ``last_provider_status`` says (``explain`` reads it).
WAITING = "waiting for a live turn (ORCH_MAX_LIVE_TURNS_PER_OWNER)"
#: The least countdown between two looks: a step that polls every 0.1 s does not look at its
#: owner's turns ten times a second.
LEAST_COUNTDOWN = 1.0


def countdown(entry: Entry) -> float:
    """Seconds until the held step's task looks again."""
    return max(entry.spec.poll_interval, LEAST_COUNTDOWN)


def held(
    session: Session, settings: Settings, run_id: str, entry: Entry, now: datetime
) -> Done[Outcome]:
    """Wait for one of the owner's turns to end, saying so on the step; fail the run
    ``over_limit`` once it has waited ``ORCH_MAX_LIVE_TURN_WAIT``."""
    step = entry.step
    since = _startable_since(session, run_id, entry)
    if now - since <= timedelta(seconds=settings.max_live_turn_wait):
        touch_step(session, step, now, last_provider_status=WAITING)
        return Done(Poll(countdown(entry), entry.tick))
    owner = session.scalar(select(Run.owner).where(Run.id == run_id))
    assert owner is not None
    waited = (
        f"step {step.step_id} waited {settings.max_live_turn_wait:g} s "
        "(ORCH_MAX_LIVE_TURN_WAIT) for a turn: "
    )
    try:
        admission.check(session, settings, owner, (admission.LIVE_TURNS,), 1, waited)
        error = f"{waited}its owner's turns were full"
    except LimitExceeded as exc:
        error = exc.problem
    return Done(
        Halt("waited too long for a live turn"),
        fail(session, settings, run_id, error, now, over=True),
    )


def _startable_since(session: Session, run_id: str, entry: Entry) -> datetime:
    """When the step could first start: its retry's time, else when the step before it ended,
    else when its run was launched."""
    step = entry.step
    if step.status == StepStatus.RETRYING and step.retry_at is not None:
        return step.retry_at
    before = (
        select(func.max(Step.finished_at))
        .where(Step.run_id == run_id, Step.index == step.index - 1)
        .scalar_subquery()
    )
    created = select(Run.created_at).where(Run.id == run_id).scalar_subquery()
    since: datetime | None = session.scalar(select(func.coalesce(before, created)))
    assert since is not None
    return since
