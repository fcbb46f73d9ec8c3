"""Cancel: the request, the hard path that lands before it returns, and the cooperative end.

Ordering that gives invariant 2 (no provider turn starts after ``cancel`` returns): the
request is written first, under the run row's lock; a step claims a provider start
(``steps.start_claimed_at``, a compare-and-set under the same lock) only while no cancel is
requested. So once the request has committed, no start can begin; a start already in flight
ends within one provider call (the transport's hard deadline), and ``finish`` waits for its
claim to clear before it reads the turns to stop. No lock is held across the provider call.

A run with branches (``for_each``, ``parallel``) is cancelled with them: its request is
recorded first (so its step admits no more branches), then each live branch run's, and
``finish`` ends every branch run the same way before the parent.
"""

from __future__ import annotations

import functools
import time
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestration import closing, deadlines, turns
from orchestration.errors import IllegalTransition
from orchestration.followups import Done, Followups, Transact
from orchestration.models import Run, Step
from orchestration.settings import MARGIN_SECONDS, Settings
from orchestration.states import RUN_TERMINAL, STEP_LIVE, RunStatus, StopReason
from orchestration.transitions import touch_run, transition_run

#: How often ``cancel`` looks whether a provider start in flight has ended (seconds).
_START_POLL_SECONDS = 0.02


def request(transact: Transact, settings: Settings, run_id: str, *, now: datetime, by: str) -> bool:
    """Record the cancel request and move the run to ``cancelling``, then wait until no
    provider start of the run is in flight (at most one provider call): from the return on,
    no turn can start, graceful or not.

    Returns ``False`` when the run is already terminal (nothing to do).
    """
    if not transact(lambda session: Done(_record_request(session, settings, run_id, now, by))):
        return False
    branches = transact(lambda session: Done(closing.live_branches(session, run_id)))
    for branch in branches:
        transact(functools.partial(_request_branch, settings, branch, now, by))
    for run in (run_id, *branches):
        _await_starts(transact, settings, run, now)
    return True


def _request_branch(
    settings: Settings, run_id: str, now: datetime, by: str, session: Session
) -> Done[bool]:
    return Done(_record_request(session, settings, run_id, now, f"{by}, with its parent"))


def _record_request(
    session: Session, settings: Settings, run_id: str, now: datetime, by: str
) -> bool:
    run = session.get(Run, run_id, populate_existing=True)
    if run is None or run.status in RUN_TERMINAL:
        return False
    # This UPDATE takes the run row's lock: it waits for a step that is claiming a start.
    if not touch_run(
        session, run_id, now, cancel_requested_at=func.coalesce(Run.cancel_requested_at, now)
    ):
        return False
    session.refresh(run)
    if run.status != RunStatus.CANCELLING:
        deadline = deadlines.for_run(
            settings,
            run,
            heartbeat_at=run.heartbeat_at or run.created_at,
            status=RunStatus.CANCELLING,
            now=now,
        )
        transition_run(
            session,
            run_id,
            RunStatus.CANCELLING,
            cause=f"cancel requested by {by}",
            now=now,
            values={"deadline_at": deadline},
        )
    return True


def finish(
    transact: Transact,
    settings: Settings,
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
    stop task after this returns, so a hanging provider cannot hold a cancel. The sweeper
    passes ``inline=False``: every stop is handed off, none runs in its pass. ``revoke`` is
    false when the caller is the run's own step task. Returns ``False`` when another writer
    ended the run first (that writer's end stands).
    """
    for branch in transact(lambda session: Done(closing.live_branches(session, run_id))):
        finish(
            transact, settings, branch, now=now, stop_reason=StopReason.PARENT_ENDED,
            cause=f"{cause} (its parent run)", revoke=True, lock_timeout=lock_timeout,
            inline=inline,
        )  # fmt: skip
    # The tasks are revoked as soon as this read commits, before the provider cancels: a step
    # task woken by its provider's answer must not race the cancel to the terminal row.
    live = transact(lambda session: _live(session, run_id, revoke=revoke))
    if live is None:
        return False
    if inline:
        results = turns.stop_within(settings, live, settings.cancel_call_timeout)
    else:
        results = turns.pending(live)
    errors = [f"{r.turn.ref.key}: {r.error}" for r in results if r.error]
    note = f"; provider cancel errors: {'; '.join(errors)}" if errors else ""

    def close(session: Session) -> Done[bool]:
        then = closing.end_run(
            session,
            settings,
            run_id,
            RunStatus.CANCELLED,
            stop_reason=stop_reason,
            cause=cause + note,
            now=now,
            revoke=False,
            stops=results,
            stop_attempts=1 if inline else 0,
        )
        return Done(True, then)

    try:
        return transact(close, lock_timeout=lock_timeout)
    except IllegalTransition:
        return False


def _live(session: Session, run_id: str, *, revoke: bool) -> Done[list[turns.LiveTurn] | None]:
    run = session.get(Run, run_id)
    if run is None or run.status in RUN_TERMINAL:
        return Done(None)
    then = Followups(revoke=tuple(run.task_ids)) if revoke else Followups()
    return Done(turns.live_turns(session, run), then)


def stated_bound(settings: Settings) -> float:
    """The longest ``cancel`` takes to return, in seconds, whatever the providers do: a start
    in flight holds the run row for at most one provider call, the inline cancels share
    ``ORCH_CANCEL_CALL_TIMEOUT``, and the margin covers the database writes."""
    return settings.provider_timeout + settings.cancel_call_timeout + MARGIN_SECONDS


def _await_starts(transact: Transact, settings: Settings, run_id: str, now: datetime) -> None:
    """Wait until no provider start of the run is in flight: a start claimed before the cancel
    request committed either records its turn (so it is stopped next) or ends by its hard
    deadline. A claim older than one provider call plus margin belongs to a dead worker and is
    not waited for (its turn, if any, is stopped by its key)."""
    window = turns.claim_window(settings)
    until = time.monotonic() + window.total_seconds()
    while True:
        in_flight = transact(
            lambda session: Done(
                session.scalar(
                    select(func.count())
                    .select_from(Step)
                    .where(
                        Step.run_id == run_id,
                        Step.status.in_([status.value for status in STEP_LIVE]),
                        Step.start_claimed_at > now - window,
                    )
                )
            )
        )
        if not in_flight or time.monotonic() >= until:
            return
        # Observing a bounded call end, not ordering two writers: the claim is the order.
        time.sleep(_START_POLL_SECONDS)
