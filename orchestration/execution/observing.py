"""What an observation of a turn means: finish, fail, park, time out, or poll again."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from orchestration.core import deadlines
from orchestration.core.followups import Done
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import ParkReason, RetryOn, RunStatus, StepStatus
from orchestration.execution import finishing, parking, retrying
from orchestration.execution.entry import Entry
from orchestration.execution.finishing import EffectsDue
from orchestration.execution.outcomes import Halt, Outcome, Poll
from orchestration.execution.rows import fail
from orchestration.limits import bounds
from orchestration.providers.base import FINISHED, STOPPED, ProviderStatus, TurnStatus
from orchestration.runs.transitions import touch_step, transition_run, transition_step
from orchestration.workflows.steps import StepSpec

_WORKING = (ProviderStatus.PENDING, ProviderStatus.RUNNING)


def unchanged(entry: Entry, observed: TurnStatus, now: datetime) -> bool:
    """Whether the observation leaves nothing to write: the turn still works, as last seen,
    on a running run, inside its timeout. The poll is then the entry's one transaction."""
    timeout_at = deadlines.step_timeout_at(entry.step.started_at, entry.spec.timeout)
    return (
        observed.status in _WORKING
        and entry.run_status is RunStatus.RUNNING
        and entry.step.status is StepStatus.RUNNING
        and (observed.raw[:200] or None) == entry.step.last_provider_status
        and (timeout_at is None or now < timeout_at)
    )


def observe(
    session: Session,
    settings: Settings,
    run: Run,
    step: Step,
    spec: StepSpec,
    observed: TurnStatus,
    now: datetime,
    *,
    captured: tuple[Any, str | None] | None,
    steps: int,
    chained: bool,
) -> Done[Outcome | EffectsDue]:
    """Act on ``observed`` in the transaction that locked ``run`` and ``step``."""
    said = {"last_provider_status": observed.raw[:200] or None}
    status = observed.status
    if status in FINISHED:
        return finishing.finish(
            session,
            settings,
            run,
            step,
            observed.output,
            now,
            captured=captured,
            steps=steps,
            chained=chained,
            recorded=said,
        )
    touch_step(session, step, now, **said)
    if status in STOPPED:
        why = observed.error or f"the provider ended the turn as {observed.raw!r}"
        if status is ProviderStatus.FAILED and retrying.allowed(spec, step, RetryOn.FAILED):
            return retrying.next_attempt(
                session, settings, run, step, spec, RetryOn.FAILED, why, now
            )
        return Done(
            Halt("turn failed"),
            fail(session, settings, run.id, f"step {step.step_id}: {why}{_of(spec, step)}", now),
        )
    if status is ProviderStatus.INPUT_REQUIRED:
        too_big = bounds.over(
            observed.prompt, settings.max_prompt_bytes, "the prompt", "ORCH_MAX_PROMPT_BYTES"
        )
        if too_big:
            return Done(
                Halt("prompt too large"),
                fail(session, settings, run.id, f"step {step.step_id}: {too_big}", now, over=True),
            )
        parking.park(session, settings, run, step, ParkReason.HUMAN, now, prompt=observed.prompt)
        return Done(Halt("parked for a human answer"))
    timeout_at = deadlines.step_timeout_at(step.started_at, spec.timeout)
    if timeout_at is not None and now >= timeout_at:
        return Done(Halt("step timed out"), parking.time_out(session, settings, run, step, now))
    if status is ProviderStatus.RATE_LIMITED:
        until = observed.reset_at or now + timedelta(seconds=spec.max_poll_interval)
        if retrying.allowed(spec, step, RetryOn.RATE_LIMITED):
            return retrying.next_attempt(
                session,
                settings,
                run,
                step,
                spec,
                RetryOn.RATE_LIMITED,
                f"rate limited until {until.isoformat()}",
                now,
                not_before=until,
            )
        parking.park(
            session, settings, run, step, ParkReason.ENGINE_LIMIT, now, waiting_until=until
        )
        expired = parking.expire(session, settings, run, now)
        if expired is not None:
            return Done(Halt("park expired"), expired)
        wait = max(spec.poll_interval, (until - now).total_seconds())
        countdown = parking.bounded(min(wait, spec.max_poll_interval), timeout_at, now)
        return Done(Poll(countdown, step.polls))
    parking.unpark(session, run, step, now)
    return Done(Poll(parking.next_poll(spec, step.started_at, step.polls, now), step.polls))


def _of(spec: StepSpec, step: Step) -> str:
    """Which attempt failed, when the step had more than one."""
    if spec.retry is None or spec.retry.attempts == 1:
        return ""
    return f" (attempt {step.attempt} of {spec.retry.attempts})"


def outage(
    session: Session,
    settings: Settings,
    run: Run,
    step: Step,
    spec: StepSpec,
    error: str,
    now: datetime,
) -> Done[Outcome | EffectsDue]:
    """The provider could not be reached: park ``platform_interrupt`` and back off, until the
    park's budget or the step's timeout ends the run."""
    if step.status == StepStatus.PENDING:
        transition_step(session, step, StepStatus.RUNNING, cause="turn starting", now=now)
    if run.status == RunStatus.QUEUED:
        transition_run(session, run.id, RunStatus.RUNNING, cause="first step starting", now=now)
    if retrying.allowed(spec, step, RetryOn.PLATFORM_INTERRUPT):
        session.refresh(step)
        session.refresh(run)
        return retrying.next_attempt(
            session, settings, run, step, spec, RetryOn.PLATFORM_INTERRUPT, error, now
        )
    touch_step(session, step, now, error=bounds.error_text(error, settings))
    parking.park(session, settings, run, step, ParkReason.PLATFORM_INTERRUPT, now)
    expired = parking.expire(session, settings, run, now)
    if expired is not None:
        return Done(Halt("park expired"), expired)
    return Done(Poll(parking.next_poll(spec, step.started_at, step.polls, now), step.polls))
