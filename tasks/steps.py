"""The step task: one execution of ``Stepper.advance``, mapped onto Celery's controls."""

from __future__ import annotations

import os
import socket
from functools import lru_cache

from celery import Task
from celery.exceptions import Ignore
from sqlalchemy.exc import DBAPIError

from orchestration.celery_config import STEP_TASK
from orchestration.dispatch import CeleryDispatcher
from orchestration.stepper import Halt, Poll, Stepper
from tasks.celery_app import app, settings

#: Consecutive database failures a step task rides out (with backoff) before it gives up and
#: leaves the run to the sweeper's dead-heartbeat re-arm.
MAX_DB_ERRORS = 12


@lru_cache(maxsize=1)
def _stepper(pid: int) -> Stepper:
    return Stepper(settings, CeleryDispatcher(app, settings), worker=socket.gethostname(), pid=pid)


# max_retries=None: the bound on polling is the step's timeout, checked against the database
# at every execution, not a retry count that a redelivery could reset.
@app.task(bind=True, name=STEP_TASK, max_retries=None, acks_late=True)
def advance_step(self: Task, run_id: str, index: int, tick: int = 0, db_errors: int = 0) -> None:
    """Start, poll or finish step ``index`` of ``run_id``; ``tick`` fences duplicates."""
    stepper = _stepper(os.getpid())
    try:
        outcome = stepper.advance(run_id, int(index), int(tick))
    except DBAPIError as exc:
        # The database dropped us (a restart, a failover). The retry carries the tick this
        # execution fenced (if it got that far), so it still owns the step when it comes back.
        if db_errors >= MAX_DB_ERRORS:
            raise
        owned = stepper.fenced_tick if stepper.fenced_tick is not None else tick
        raise self.retry(
            countdown=min(2.0**db_errors * 0.25, settings.max_poll_interval_limit),
            kwargs={"tick": owned, "db_errors": db_errors + 1},
            argsrepr=f"(run={run_id}, step={index})",
            max_retries=None,
            exc=exc,
        ) from exc
    if isinstance(outcome, Poll):
        raise self.retry(
            countdown=outcome.countdown,
            kwargs={"tick": outcome.tick},
            max_retries=None,
            argsrepr=f"(run={run_id}, step={index})",
            kwargsrepr=f"{{'tick': {outcome.tick}}}",
        )
    if isinstance(outcome, Halt):
        # Ignore acks the message and stops the chain: nothing after this step is sent.
        raise Ignore(outcome.reason)
