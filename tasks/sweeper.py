"""The tasks beat schedules (``beat_schedule.py``): the sweeper, the workflow schedules, and
retention."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from orchestration.core.db import utcnow
from orchestration.runtime.celery_config import (
    PRUNE_INTERVAL,
    PRUNE_TASK,
    SCHEDULES_TASK,
    SWEEP_TASK,
)
from orchestration.upkeep import retention, schedules
from orchestration.upkeep.sweeper import Sweeper
from tasks.celery_app import app, executor, settings
from tasks.limits import DATABASE_WAIT, sweep_limits

_SOFT, _HARD = sweep_limits(settings)
#: A pass starts no work past this many seconds: what is left goes to the next pass, and the
#: last fire or action (its launch checks and a database wait) still ends before the soft
#: limit, so a pass is never killed midway with owners that sort late left out.
_BUDGET = _SOFT - settings.launch_check_seconds - DATABASE_WAIT


@app.task(
    name=SWEEP_TASK, acks_late=True, ignore_result=True, soft_time_limit=_SOFT, time_limit=_HARD
)
def sweep() -> dict[str, Any]:
    """One sweeper pass; returns its report (shown in Flower)."""
    return Sweeper(settings, executor, budget=_BUDGET).sweep()


@app.task(
    name=SCHEDULES_TASK,
    acks_late=True,
    ignore_result=True,
    soft_time_limit=_SOFT,
    time_limit=_HARD,
)
def fire_schedules() -> dict[str, Any]:
    """One pass of the workflow schedules: each owner's share of the due fires, round robin,
    each launched (or skipped) once."""
    return schedules.fire(executor, settings, utcnow(), budget=_BUDGET)


@app.task(
    name=PRUNE_TASK,
    acks_late=True,
    ignore_result=True,
    soft_time_limit=PRUNE_INTERVAL / 2,
    time_limit=PRUNE_INTERVAL / 2 + 60,
)
def prune() -> dict[str, Any]:
    """Delete the runs that ended more than ``ORCH_RETENTION_DAYS`` ago; a pass stopped by its
    time limit loses only its current batch (rolled back), and the next pass goes on."""
    assert settings.retention_days is not None
    cutoff = utcnow() - timedelta(days=settings.retention_days)
    return retention.prune(executor, cutoff=cutoff, artifact_dir=settings.artifact_dir)
