"""The sweeper task that beat schedules (``beat_schedule.py``)."""

from __future__ import annotations

from typing import Any

from orchestration.celery_config import SWEEP_TASK
from orchestration.dispatch import CeleryDispatcher
from orchestration.sweeper import Sweeper
from tasks.celery_app import app, settings


@app.task(name=SWEEP_TASK, acks_late=True, ignore_result=True)
def sweep() -> dict[str, Any]:
    """One sweeper pass; returns its report (shown in Flower)."""
    return Sweeper(settings, CeleryDispatcher(app, settings)).sweep()
