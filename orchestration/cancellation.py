"""Cancel: the request, the hard path that lands before it returns, and the cooperative end.

Ordering that gives invariant 2 (no provider turn starts after ``cancel`` returns): the
request is written first, under the run row's lock; a step claims a provider start under the
same lock and only while no cancel is requested. So once the request has committed, no start
can begin; any start already in flight has committed its turn, which is cancelled next.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func

from orchestration import deadlines, turns
from orchestration.closing import close_run
from orchestration.db import session_scope
from orchestration.dispatch import Dispatcher
from orchestration.errors import IllegalTransition
from orchestration.models import Run
from orchestration.settings import Settings
from orchestration.states import RUN_TERMINAL, RunStatus, StopReason
from orchestration.transitions import touch_run, transition_run


def request(settings: Settings, run_id: str, *, now: datetime, by: str) -> bool:
    """Record the cancel request and move the run to ``cancelling``.

    Returns ``False`` when the run is already terminal (nothing to do).
    """
    with session_scope(settings.database_url) as session:
        run = session.get(Run, run_id, populate_existing=True)
        if run is None or run.status in RUN_TERMINAL:
            return False
        # This UPDATE takes the run row's lock: it waits for a step that is starting a turn.
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
) -> bool:
    """Stop the run's tasks and provider turns and write the terminal ``cancelled`` rows.

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
    errors = turns.stop(settings, live)
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
    except IllegalTransition:
        return False
    return True
