"""The step task: one execution of ``Stepper.advance``, mapped onto Celery's controls.

A poll's retry carries no chain (``request.chain`` is dropped before ``self.retry``), so a
message stays the same size however long the run; the execution that finishes a step
without a next link in its message arms the next segment (``chains``).
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache

from celery import Task
from celery.exceptions import Ignore
from celery.signals import worker_process_shutdown, worker_shutdown
from celery.utils.log import get_task_logger
from kombu.exceptions import OperationalError
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError

from orchestration.core.db import utcnow
from orchestration.execution import Halt, Poll, Stepper
from orchestration.runtime.celery_config import STEP_TASK
from orchestration.runtime.poll_lateness import MinuteRecorder, lateness
from tasks.celery_app import app, executor, settings
from tasks.limits import call_limits

#: Consecutive database failures a step task rides out (with backoff) before it gives up and
#: leaves the run to the sweeper's dead-heartbeat re-arm.
MAX_DB_ERRORS = 12
#: An execution's provider calls (a start, the status right after it, the checkpoint of a
#: turn that finished) share one ``ORCH_PROVIDER_TIMEOUT``; or the effects' snapshot and
#: the webhook when it runs the effects.
_SOFT, _HARD = call_limits(settings, calls=1, webhook=True)
logger = get_task_logger(__name__)


class DatabaseUnavailable(Exception):
    """What a retry after a database error reports: the error's class, never its SQL
    parameters (they hold step inputs and outputs, and would land in logs and Flower)."""


@lru_cache(maxsize=1)
def _stepper(pid: int) -> Stepper:
    return Stepper(settings, executor, worker=socket.gethostname(), pid=pid)


@lru_cache(maxsize=1)
def _lateness(pid: int) -> MinuteRecorder:
    return MinuteRecorder(executor, f"{socket.gethostname()}:{pid}")


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_lateness(**_: object) -> None:
    """The last minute's polls of this process, before it exits."""
    if _lateness.cache_info().currsize:
        _lateness(os.getpid()).flush()


def _announce_revoked(task: Task) -> None:
    """The ``task-revoked`` event Celery sends when its revoke wins the race, so Flower does
    not show the task of a run that ended under it as started for ever. A monitor's event is
    not worth failing the step over: a broker that refuses it is logged and passed."""
    try:
        task.send_event("task-revoked", retry=False, terminated=False, signum=None, expired=False)
    except (OperationalError, OSError) as exc:
        logger.warning("task-revoked event for %s not sent: %s", task.request.id, exc)


# max_retries=None: the bound on polling is the step's timeout, checked against the database
# at every execution, not a retry count that a redelivery could reset.
@app.task(
    bind=True,
    name=STEP_TASK,
    max_retries=None,
    acks_late=True,
    soft_time_limit=_SOFT,
    time_limit=_HARD,
)
def advance_step(self: Task, run_id: str, index: int, tick: int = 0, db_errors: int = 0) -> None:
    """Start, poll or finish step ``index`` of ``run_id``; ``tick`` fences duplicates."""
    stepper = _stepper(os.getpid())
    now = utcnow()
    late = lateness(self.request.eta, now)
    if late is not None:
        _lateness(os.getpid()).observe(late, now)
    chained = bool(self.request.chain)
    try:
        outcome = stepper.advance(run_id, int(index), int(tick), chained=chained)
    except (DataError, IntegrityError) as exc:
        # A value the database refuses is refused again on every retry: fail the step.
        owned = stepper.fenced_tick if stepper.fenced_tick is not None else tick
        what = type(exc.orig).__name__ if exc.orig is not None else type(exc).__name__
        outcome = stepper.refuse(run_id, int(index), owned, what)
    except DBAPIError as exc:
        # The database dropped us (a restart, a failover). The retry carries the tick this
        # execution fenced (if it got that far), so it still owns the step when it comes back.
        if db_errors >= MAX_DB_ERRORS:
            raise DatabaseUnavailable(type(exc.orig).__name__) from None
        owned = stepper.fenced_tick if stepper.fenced_tick is not None else tick
        raise self.retry(
            countdown=min(2.0**db_errors * 0.25, settings.max_poll_interval_limit),
            kwargs={"tick": owned, "db_errors": db_errors + 1},
            argsrepr=f"(run={run_id}, step={index})",
            max_retries=None,
            exc=DatabaseUnavailable(type(exc.orig).__name__),
        ) from None
    if isinstance(outcome, Poll):
        # The rest of the chain stays behind: the step that finishes this one arms it anew.
        self.request.chain = None
        raise self.retry(
            countdown=outcome.countdown,
            kwargs={"tick": outcome.tick},
            max_retries=None,
            argsrepr=f"(run={run_id}, step={index})",
            kwargsrepr=f"{{'tick': {outcome.tick}}}",
        )
    if isinstance(outcome, Halt):
        if outcome.revoked:
            _announce_revoked(self)
        # Ignore acks the message and stops the chain: nothing after this step is sent.
        raise Ignore(outcome.reason)
