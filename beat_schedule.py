"""The Celery beat schedule: one sweeper pass every ``ORCH_SWEEP_INTERVAL`` seconds.

Run exactly one beat (``orchestration beat``); a second one is harmless (every pass is
idempotent and every write a compare-and-set) but wasteful.
"""

from __future__ import annotations

from typing import Any

from orchestration.runtime.celery_config import SWEEP_TASK
from orchestration.settings import Settings


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """The schedule entries for ``app.conf.beat_schedule``."""
    return {
        "orchestration-sweep": {
            "task": SWEEP_TASK,
            "schedule": settings.sweep_interval,
            # A pass that waited longer than one interval is stale: the next one replaces it.
            "options": {"expires": settings.sweep_interval, "queue": settings.queue},
        }
    }
