"""Step retries: ending an attempt that its ``retry`` lists, and holding the next one back.

An attempt ends in the transaction that saw why (a ``failed`` turn, a ``rate_limited`` one,
a provider that could not be reached): the step moves to ``retrying`` with the next attempt
number, a new idempotency key (at most one turn per attempt) and ``retry_at``; what the attempt
came to is appended to ``past_attempts``. A turn that may still be live on the provider is
stopped first: its stop is recorded ``pending`` on the step (naming its key) for the stop
task, and the next attempt's start waits until that stop is settled. The wait itself is a
countdown, never a sleep: each execution before ``retry_at`` only stamps the heartbeat.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import null
from sqlalchemy.orm import Session

from orchestration.core.followups import Done, Followups
from orchestration.core.models import Run, Step
from orchestration.core.settings import MARGIN_SECONDS, Settings
from orchestration.core.states import RetryOn, RunStatus, StepStatus, TurnStopStatus
from orchestration.execution.entry import Entry
from orchestration.execution.fence import Refusal
from orchestration.execution.outcomes import Halt, Outcome, Poll
from orchestration.execution.parking import leave_park
from orchestration.execution.rows import fail
from orchestration.limits import bounds
from orchestration.providers.base import TurnRef
from orchestration.runs import new_rows, turns
from orchestration.runs.transitions import transition_step
from orchestration.workflows.steps import StepSpec


def allowed(spec: StepSpec, step: Step, reason: RetryOn) -> bool:
    """Whether the step's current attempt, ending for ``reason``, gets another."""
    return spec.retry is not None and spec.retry.retries(step.attempt, reason)


def next_attempt(
    session: Session,
    settings: Settings,
    run: Run,
    step: Step,
    spec: StepSpec,
    reason: RetryOn,
    error: str,
    now: datetime,
    *,
    not_before: datetime | None = None,
) -> Done[Outcome]:
    """End the step's current attempt for ``reason`` and schedule the next one after the
    backoff (or at ``not_before``, if later: a rate limit's reset). A turn that may still be
    running (anything but a ``failed`` one) gets a pending stop."""
    assert spec.retry is not None
    text = bounds.error_text(error, settings)
    retry_at = now + timedelta(seconds=spec.retry.delay(step.attempt))
    if not_before is not None and not_before > retry_at:
        retry_at = min(not_before, now + timedelta(seconds=settings.max_retry_backoff))
    assert step.idempotency_key is not None
    old_turn = turns.LiveTurn(
        run.id,
        step.index,
        step.pk,
        step.provider,
        TurnRef(step.idempotency_key, step.provider_run_id, spec.options),
    )
    ended = {
        "attempt": step.attempt,
        "reason": reason.value,
        "error": text,
        "provider_run_id": step.provider_run_id,
        "started_at": step.started_at.isoformat() if step.started_at else None,
        "ended_at": now.isoformat(),
    }
    if run.status == RunStatus.PARKED:
        leave_park(session, run.id, now, cause=f"step {step.step_id} retries")
    attempt = step.attempt + 1
    transition_step(
        session,
        step,
        StepStatus.RETRYING,
        cause=f"attempt {step.attempt} ended ({reason.value}); attempt {attempt} at "
        f"{retry_at.isoformat()}",
        now=now,
        values={
            "attempt": attempt,
            "idempotency_key": new_rows.idempotency_key(run.id, step.step_id, attempt),
            "provider_run_id": None,
            "started_at": None,
            "start_claimed_at": None,
            "last_provider_status": None,
            "prompt": None,
            "answer": null(),
            "asked_turn": null(),
            "error": text,
            "retry_at": retry_at,
            "next_poll_at": retry_at,
            "past_attempts": [*(step.past_attempts or []), ended],
        },
    )
    then = Followups()
    if (
        reason is not RetryOn.FAILED
    ):  # recorded against the old key, now that the step has a new one
        then = turns.hand_off(session, turns.pending([old_turn]), now)
    return Done(Poll(wait(settings, retry_at, now), step.polls), then)


def wait(settings: Settings, retry_at: datetime, now: datetime) -> float:
    """The countdown towards ``retry_at``, in hops no longer than a poll may be (each
    execution on the way stamps the heartbeat)."""
    return max(0.0, min((retry_at - now).total_seconds(), settings.max_poll_interval_limit))


def _stop_silence(settings: Settings) -> timedelta:
    """The longest a pending stop can go without an attempt while its task lives: one
    provider call, the stop task's longest backoff (30 s) and the margin."""
    return timedelta(seconds=settings.provider_timeout + 30 + MARGIN_SECONDS)


def held(
    session: Session,
    settings: Settings,
    run_id: str,
    entry: Entry,
    refusal: Refusal,
    now: datetime,
) -> Done[Outcome]:
    """What a ``retrying`` step does while its next attempt may not start
    (:func:`fence.refusal`): wait out its backoff, or the stop of the previous attempt's turn
    (handed to the stop task again when it went silent for longer than one attempt takes: its
    message was lost). A previous turn the provider refused to stop fails the run: a second
    turn must not run beside it."""
    step = entry.step
    stop = step.turn_stop or {}
    if refusal is Refusal.BACKOFF:
        assert step.retry_at is not None
        return Done(Poll(wait(settings, step.retry_at, now), entry.tick))
    if refusal is Refusal.STOPPING:
        if now - datetime.fromisoformat(stop["at"]) <= _stop_silence(settings):
            return Done(Poll(entry.spec.poll_interval, entry.tick))
        ref = TurnRef(stop["key"], stop.get("provider_run_id"), entry.spec.options)
        turn = turns.LiveTurn(run_id, step.index, step.pk, step.provider, ref)
        again = turns.Stopped(turn, TurnStopStatus.PENDING, stop.get("error"))
        then = turns.hand_off(session, [again], now, attempts=int(stop.get("attempts", 0)))
        return Done(Poll(entry.spec.poll_interval, entry.tick), then)
    return Done(
        Halt("the previous attempt's turn could not be stopped"),
        fail(
            session,
            settings,
            run_id,
            f"step {step.step_id}: attempt {step.attempt - 1}'s turn could not be stopped "
            f"before attempt {step.attempt}: {stop.get('error')}",
            now,
        ),
    )
