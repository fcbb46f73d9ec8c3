"""The sweeper task that beat schedules (``beat_schedule.py``)."""

from __future__ import annotations

from typing import Any

from orchestration.runtime.celery_config import SWEEP_TASK
from orchestration.sweeper import Sweeper
from tasks.celery_app import app, executor, settings
from tasks.limits import sweep_limits

_SOFT, _HARD = sweep_limits(settings)


@app.task(
    name=SWEEP_TASK, acks_late=True, ignore_result=True, soft_time_limit=_SOFT, time_limit=_HARD
)
def sweep() -> dict[str, Any]:
    """One sweeper pass; returns its report (shown in Flower)."""
    return Sweeper(settings, executor).sweep()
