"""The Celery beat schedule: one sweeper pass every ``ORCH_SWEEP_INTERVAL`` seconds, one pass
of the workflow schedules every ``ORCH_SCHEDULE_INTERVAL`` seconds, and with
``ORCH_RETENTION_DAYS`` set, one retention pass an hour.

Every pass goes to the upkeep queue (``ORCH_UPKEEP_QUEUE``), never behind the steps on
``ORCH_QUEUE``: with one queue, a backlog longer than an interval expired every sweeper pass
before a worker took it, and deadlines were missed (chaos finding 12). Every worker that
consumes the step queue consumes the upkeep queue too (``tasks/celery_app.py``).

Run exactly one beat (``orchestration beat``); a second one is harmless (every pass is
idempotent and every write a compare-and-set) but wasteful.
"""

from __future__ import annotations

from typing import Any

from orchestration.core.settings import Settings
from orchestration.runtime.celery_config import (
    PRUNE_INTERVAL,
    PRUNE_TASK,
    SCHEDULES_TASK,
    SWEEP_TASK,
)


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """The schedule entries for ``app.conf.beat_schedule``."""
    schedule: dict[str, dict[str, Any]] = {
        "orchestration-sweep": {
            "task": SWEEP_TASK,
            "schedule": settings.sweep_interval,
            # A pass that waited longer than one interval is stale: the next one replaces it.
            "options": {"expires": settings.sweep_interval, "queue": settings.upkeep_queue},
        },
        # Each fire is recorded once, so a late or doubled pass launches nothing twice.
        "orchestration-schedules": {
            "task": SCHEDULES_TASK,
            "schedule": settings.schedule_interval,
            "options": {"expires": settings.schedule_interval, "queue": settings.upkeep_queue},
        },
    }
    if settings.retention_days is not None:
        schedule["orchestration-prune"] = {
            "task": PRUNE_TASK,
            "schedule": PRUNE_INTERVAL,
            "options": {"expires": PRUNE_INTERVAL, "queue": settings.upkeep_queue},
        }
    return schedule
