"""The stop task: a provider cancel handed off by whoever ended the run, bounded and retried,
within its owner's share of cancels in flight (``ORCH_STOP_TURNS_PER_OWNER``)."""

from __future__ import annotations

from celery import Task

from orchestration.core.db import utcnow
from orchestration.runs import stop_slots
from orchestration.runtime.celery_config import STOP_TASK
from tasks.celery_app import app, executor, settings
from tasks.limits import call_limits

_SOFT, _HARD = call_limits(settings, calls=1)


@app.task(
    bind=True,
    name=STOP_TASK,
    max_retries=None,
    acks_late=True,
    ignore_result=True,
    soft_time_limit=_SOFT,
    time_limit=_HARD,
)
def stop_turn(self: Task, run_id: str, index: int) -> None:
    """Cancel the provider turn of step ``index`` of ``run_id``; attempts are counted on the
    step (``turn_stop``), so a redelivery cannot make them unbounded. While the owner's
    slots are all held (by stops that may hang up to their bound), it waits its turn at the
    end of the queue without spending an attempt."""
    countdown = stop_slots.attempt(executor, settings, run_id, int(index), utcnow(), hold=_HARD)
    if countdown is not None:
        raise self.retry(
            countdown=countdown, max_retries=None, argsrepr=f"(run={run_id}, step={index})"
        )
