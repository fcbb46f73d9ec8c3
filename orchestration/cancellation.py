"""Cancel: the request, the hard path that lands before it returns, and the cooperative end.

Ordering that gives invariant 2 (no provider turn starts after ``cancel`` returns): the
request is written first, under the run row's lock; a step claims a provider start
(``steps.start_claimed_at``, a compare-and-set under the same lock) only while no cancel is
requested. So once the request has committed, no start can begin; a start already in flight
ends within one provider call (the transport's hard deadline), and ``finish`` waits for its
claim to clear before it reads the turns to stop. No lock is held across the provider call.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from sqlalchemy import func, select

from orchestration import deadlines, turns
from orchestration.closing import close_run
from orchestration.db import session_scope
from orchestration.dispatch import Dispatcher
from orchestration.errors import IllegalTransition
from orchestration.models import Run, Step
from orchestration.settings import MARGIN_SECONDS, Settings
from orchestration.states import RUN_TERMINAL, STEP_LIVE, RunStatus, StopReason
from orchestration.transitions import touch_run, transition_run

#: How often ``cancel`` looks whether a provider start in flight has ended (seconds).
_START_POLL_SECONDS = 0.02


def request(settings: Settings, run_id: str, *, now: datetime, by: str) -> bool:
    """Record the cancel request and move the run to ``cancelling``, then wait until no
    provider start of the run is in flight (at most one provider call): from the return on,
    no turn can start, graceful or not.

    Returns ``False`` when the run is already terminal (nothing to do).
    """
    with session_scope(settings.database_url) as session:
        run = session.get(Run, run_id, populate_existing=True)
        if run is None or run.status in RUN_TERMINAL:
            return False
        # This UPDATE takes the run row's lock: it waits for a step that is claiming a start.
        if not touch_run(
            session,
            run_id,
            now,
            cancel_requested_at=func.coalesce(Run.cancel_requested_at, now),
        ):
            return False
        session.refresh(run)
        deadline = deadlines.compute(
            settings,
            RunStatus.CANCELLING,
            heartbeat_at=run.heartbeat_at or run.created_at,
            cancel_requested_at=run.cancel_requested_at,
            now=now,
        )
        if run.status != RunStatus.CANCELLING:
            transition_run(
                session,
                run_id,
                RunStatus.CANCELLING,
                cause=f"cancel requested by {by}",
                now=now,
                values={"deadline_at": deadline},
            )
    _await_starts(settings, run_id, now)
    return True


def finish(
    settings: Settings,
    dispatcher: Dispatcher | None,
    run_id: str,
    *,
    now: datetime,
    stop_reason: StopReason,
    cause: str,
    revoke: bool,
    lock_timeout: float | None = None,
    inline: bool = True,
) -> bool:
    """Stop the run's tasks and provider turns and write the terminal ``cancelled`` rows.

    The provider cancels are tried once, within ``ORCH_CANCEL_CALL_TIMEOUT`` for all turns
    together; a turn not stopped in that time is recorded ``pending`` and stopped by the
    ``stop_turn`` task after this returns, so a hanging provider cannot hold a cancel.
    The sweeper passes ``inline=False``: every stop is handed off, none runs in its pass.
    Returns ``False`` when another writer ended the run first (that writer's end stands).
    """
    with session_scope(settings.database_url) as session:
        run = session.get(Run, run_id)
        if run is None or run.status in RUN_TERMINAL:
            return False
        task_ids = list(run.task_ids)
        live = turns.live_turns(session, run)
    if revoke and dispatcher is not None:
        dispatcher.revoke(task_ids, terminate=True)
    if inline:
        results = turns.stop_within(settings, live, settings.cancel_call_timeout)
    else:
        results = turns.pending(live)
    errors = [f"{r.turn.ref.key}: {r.error}" for r in results if r.error]
    note = f"; provider cancel errors: {'; '.join(errors)}" if errors else ""
    try:
        with session_scope(settings.database_url, lock_timeout=lock_timeout) as session:
            close_run(
                session,
                settings,
                run_id,
                RunStatus.CANCELLED,
                stop_reason=stop_reason,
                cause=cause + note,
                now=now,
                dispatcher=dispatcher,
            )
            turns.stop_later(
                session, settings, dispatcher, results, now, attempts=1 if inline else 0
            )
    except IllegalTransition:
        return False
    return True


def stated_bound(settings: Settings) -> float:
    """The longest ``cancel`` takes to return, in seconds, whatever the providers do: a start
    in flight holds the run row for at most one provider call, the inline cancels share
    ``ORCH_CANCEL_CALL_TIMEOUT``, and the margin covers the database writes."""
    return settings.provider_timeout + settings.cancel_call_timeout + MARGIN_SECONDS


def _await_starts(settings: Settings, run_id: str, now: datetime) -> None:
    """Wait until no provider start of the run is in flight: a start claimed before the cancel
    request committed either records its turn (so it is stopped next) or ends by its hard
    deadline. A claim older than one provider call plus margin belongs to a dead worker and is
    not waited for (its turn, if any, is stopped by its key)."""
    window = timedelta(seconds=settings.provider_timeout + MARGIN_SECONDS)
    until = time.monotonic() + window.total_seconds()
    while True:
        with session_scope(settings.database_url) as session:
            in_flight = session.scalar(
                select(func.count())
                .select_from(Step)
                .where(
                    Step.run_id == run_id,
                    Step.status.in_([status.value for status in STEP_LIVE]),
                    Step.start_claimed_at > now - window,
                )
            )
        if not in_flight or time.monotonic() >= until:
            return
        # Observing a bounded call end, not ordering two writers: the claim is the order.
        time.sleep(_START_POLL_SECONDS)
