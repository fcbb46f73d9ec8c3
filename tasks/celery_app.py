"""The worker's Celery app: ``celery -A tasks worker`` finds it as ``tasks.app``."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import worker_process_init

from beat_schedule import beat_schedule
from orchestration.celery_config import configure
from orchestration.db import dispose_engines
from orchestration.settings import get_settings

settings = get_settings()
app = configure(Celery("orchestration"), settings)
app.conf.beat_schedule = beat_schedule(settings)
app.conf.include = ["tasks.steps", "tasks.sweeper"]


@worker_process_init.connect
def _fresh_connections(**_: Any) -> None:
    """A prefork child must not share its parent's pooled database connections."""
    dispose_engines(after_fork=True)
    logging.getLogger("orchestration").setLevel(logging.INFO)
