"""Provider turns of a run's steps: the refs the engine holds, and stopping them.

Stopping a turn is a provider call to a service the workflow named, so it may hang. It never
runs inside a sweeper pass or a step's transaction: a closing writer records the stop as
``pending`` on the step (``steps.turn_stop``) and, after its commit, hands it to the
stop task, which calls the provider with its hard bound and retries a bounded number
of times. ``cancel`` alone tries each turn once inline, within ``ORCH_CANCEL_CALL_TIMEOUT`` for
all of them together, so that a well-behaved provider has stopped the turn when it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session

from orchestration import providers
from orchestration.core.db import constant_in
from orchestration.core.errors import PermanentProviderError, ProviderError, ValidationError
from orchestration.core.followups import Done, Followups, Transact
from orchestration.core.models import Run, Step
from orchestration.core.settings import MARGIN_SECONDS, Settings
from orchestration.core.states import StepStatus, TurnStopStatus
from orchestration.limits import bounds
from orchestration.observability import tracing
from orchestration.providers import budget
from orchestration.providers.base import TurnRef
from orchestration.workflows import decoded
from orchestration.workflows.steps import TURNLESS_PROVIDERS

LOG = logging.getLogger(__name__)


def claim_window(settings: Settings) -> timedelta:
    """How long a provider start claim counts as in flight: one call's hard deadline and the
    margin. An older claim belongs to an execution that died (its turn, if any, is found by
    its key)."""
    return timedelta(seconds=settings.provider_timeout + MARGIN_SECONDS)


def start_deadline(settings: Settings, claimed_at: datetime) -> datetime:
    """The latest moment a start claimed at ``claimed_at`` may begin its turn: one call's
    bound after the claim. ``cancel`` reads the turns only once the claim is older than
    :func:`claim_window`, the margin later, so a provider that honours the deadline never
    begins a turn after a ``cancel`` returned, however long the request was in flight; the
    margin covers the skew between the engine's clock and the runtime's."""
    return claimed_at + timedelta(seconds=settings.provider_timeout)


def ref_for(session: Session, step: Step) -> TurnRef:
    """How provider calls name this step's current turn (its ``with:`` options from the run's
    cached specs: the workflow column is not read again)."""
    assert step.idempotency_key is not None
    options = decoded.of_run(session, step.run_id)[step.index].options
    return TurnRef(step.idempotency_key, step.provider_run_id, dict(options))


@dataclass(frozen=True)
class LiveTurn:
    """A turn that may be running on a provider."""

    run_id: str
    index: int
    step_pk: int
    provider: str
    ref: TurnRef


@dataclass(frozen=True)
class Stopped:
    """What one provider cancel came to."""

    turn: LiveTurn
    status: TurnStopStatus
    error: str | None = None


def live_turns(session: Session, run: Run) -> list[LiveTurn]:
    """Turns of the run's started, unfinished steps (a claimed start counts: the start call may
    have reached the provider even if its id was never recorded). An approval or a branching
    step has no turn of its own."""
    steps = session.scalars(
        select(Step)
        .where(
            Step.run_id == run.id,
            constant_in(Step.status, (StepStatus.RUNNING, StepStatus.PARKED)),
        )
        .execution_options(populate_existing=True)
    ).all()
    return [
        LiveTurn(run.id, step.index, step.pk, step.provider, ref_for(session, step))
        for step in steps
        if step.idempotency_key and step.provider not in TURNLESS_PROVIDERS
    ]


def stop_once(settings: Settings, turn: LiveTurn) -> Stopped:
    """One bounded provider cancel. An outage is ``pending`` (worth another attempt); a
    refusal is ``failed``. The error is redacted and bounded, fit to store."""
    try:
        with tracing.span("provider.cancel", provider=turn.provider, key=turn.ref.key):
            providers.get_provider(turn.provider, settings).cancel(turn.ref)
    except PermanentProviderError as exc:
        return Stopped(turn, TurnStopStatus.FAILED, bounds.error_text(str(exc), settings))
    except (ProviderError, ValidationError) as exc:
        LOG.warning("provider cancel of %s failed: %s", turn.ref.key, exc)
        return Stopped(turn, TurnStopStatus.PENDING, bounds.error_text(str(exc), settings))
    return Stopped(turn, TurnStopStatus.STOPPED)


def stop_within(settings: Settings, turns: Iterable[LiveTurn], seconds: float) -> list[Stopped]:
    """Cancel each turn once, all of them within ``seconds``. Only a stop that succeeded is
    settled: anything else stays ``pending`` for the stop task, because the caller
    may be a web app's process that lacks what the worker has (the provider's secret)."""
    results: list[Stopped] = []
    with budget.within(seconds):
        for turn in turns:
            if budget.clamp(seconds) <= 0:
                results.append(Stopped(turn, TurnStopStatus.PENDING, "not tried: no time left"))
                continue
            result = stop_once(settings, turn)
            if result.status is TurnStopStatus.FAILED:
                result = Stopped(turn, TurnStopStatus.PENDING, result.error)
            results.append(result)
    return results


def record(session: Session, result: Stopped, now: datetime, *, attempts: int) -> None:
    """Write where a turn's stop is on its step (a non-status column: the step may be
    terminal, and stays so)."""
    value: dict[str, Any] = {
        "status": result.status.value,
        "attempts": attempts,
        "error": result.error,
        "at": now.isoformat(),
        # Which turn: a retry's stop names the attempt before the step's current one.
        "key": result.turn.ref.key,
        "provider_run_id": result.turn.ref.provider_run_id,
    }
    values: dict[str, Any] = {"turn_stop": value}
    if result.turn.ref.provider_run_id is not None:
        # A turn whose start outlived its run: its id is known only to the stopper. Only for
        # the step's current attempt: a retried attempt's id must not become the new one's.
        values["provider_run_id"] = case(
            (
                Step.idempotency_key == result.turn.ref.key,
                func.coalesce(Step.provider_run_id, result.turn.ref.provider_run_id),
            ),
            else_=Step.provider_run_id,
        )
    session.execute(
        update(Step)
        .where(Step.pk == result.turn.step_pk)
        .values(**values)
        .execution_options(synchronize_session=False)
    )


def hand_off(
    session: Session, results: Iterable[Stopped], now: datetime, *, attempts: int = 0
) -> Followups:
    """Record each result on its step and return the pending ones, for the stop task to carry
    out after the caller's commit."""
    pending: list[tuple[str, int]] = []
    for result in results:
        record(session, result, now, attempts=attempts)
        if result.status is TurnStopStatus.PENDING:
            pending.append((result.turn.run_id, result.turn.index))
    return Followups(stops=tuple(pending))


def pending(turns: Iterable[LiveTurn]) -> list[Stopped]:
    """Stops not tried yet: each turn, ``pending``."""
    return [Stopped(turn, TurnStopStatus.PENDING) for turn in turns]


def turn_of(session: Session, run_id: str, index: int) -> tuple[LiveTurn, int] | None:
    """The turn a stop task is to cancel and the attempts made so far; ``None`` when
    there is nothing to stop (no such step, never started, or already settled)."""
    run = session.get(Run, run_id)
    step = session.scalars(select(Step).where(Step.run_id == run_id, Step.index == index)).first()
    if run is None or step is None or not step.idempotency_key:
        return None
    stop = step.turn_stop or {}
    if stop.get("status") != TurnStopStatus.PENDING.value:
        return None
    ref = ref_for(session, step)
    if stop.get("key") not in (None, ref.key):  # a retried attempt's turn, not the current one
        ref = TurnRef(stop["key"], stop.get("provider_run_id"), ref.options)
    turn = LiveTurn(run.id, step.index, step.pk, step.provider, ref)
    return turn, int(stop.get("attempts", 0))


def attempt(
    transact: Transact, settings: Settings, run_id: str, index: int, now: datetime
) -> float | None:
    """One attempt of a pending stop (the stop task): the provider call outside any
    transaction, then the outcome recorded. Returns the countdown before the next attempt, or
    ``None`` when the stop is settled (stopped, refused, or out of attempts)."""
    found = transact(lambda session: Done(turn_of(session, run_id, index)))
    if found is None:
        return None
    turn, attempts = found
    result = stop_once(settings, turn)
    attempts += 1
    if result.status is TurnStopStatus.PENDING and attempts >= settings.stop_attempts:
        result = Stopped(
            turn, TurnStopStatus.FAILED, f"gave up after {attempts} attempts: {result.error}"
        )
    transact(lambda session: _recorded(session, result, now, attempts))
    if result.status is TurnStopStatus.PENDING:
        return float(min(2 ** (attempts - 1), 30))
    return None


def _recorded(session: Session, result: Stopped, now: datetime, attempts: int) -> Done[None]:
    record(session, result, now, attempts=attempts)
    return Done(None)
