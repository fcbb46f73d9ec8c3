"""The worker's Celery app: ``celery -A tasks worker`` finds it as ``tasks.app``."""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery import Celery
from celery.signals import beat_init, celeryd_after_setup, worker_init, worker_process_init

from beat_schedule import beat_schedule
from orchestration.core.db import dispose_engines
from orchestration.core.errors import ConfigurationError
from orchestration.core.settings import get_settings
from orchestration.observability import tracing
from orchestration.runtime import celery_observing
from orchestration.runtime.celery_config import configure, consume_upkeep
from orchestration.runtime.celery_queue import CeleryQueue
from orchestration.runtime.executor import Executor
from orchestration.runtime.readiness import refuse_unfit

try:
    settings = get_settings()
    # Before the pool forks: the SDK restarts its export thread in each child.
    tracing.setup(settings, "orchestration-worker")
except ConfigurationError as exc:
    # ``celery -A tasks worker`` with a bad setting: one line naming the variable, exit 2.
    sys.stderr.write(f"error: {exc}\n")
    raise SystemExit(2) from None
app = configure(Celery("orchestration"), settings)
celery_observing.install(settings)
app.conf.beat_schedule = beat_schedule(settings)
app.conf.include = ["tasks.steps", "tasks.sweeper", "tasks.turns"]
#: Every task reaches the domain through this executor: one transaction per call, then the
#: followups sent through this app.
executor = Executor(settings, CeleryQueue(app, settings))


@worker_process_init.connect
def _fresh_connections(**_: Any) -> None:
    """A prefork child must not share its parent's pooled database connections."""
    dispose_engines(after_fork=True)
    logging.getLogger("orchestration").setLevel(logging.INFO)


@worker_init.connect
def _serve_or_refuse(**_: Any) -> None:
    """Before the consumer starts: a worker whose database or broker cannot serve a task
    takes none; it says why in one line and exits with status 2."""
    refuse_unfit(settings, "worker")


@celeryd_after_setup.connect
def _consume_upkeep(instance: Any, **_: Any) -> None:
    """After ``-Q`` was applied (Celery's documented use of this signal): a worker of the step
    queue consumes the upkeep queue too; one started with only ``-Q <ORCH_UPKEEP_QUEUE>`` is
    a dedicated upkeep worker."""
    consume_upkeep(instance.app, settings)


@beat_init.connect
def _schedule_or_refuse(**_: Any) -> None:
    """Before beat sends anything: the same check as a worker's."""
    refuse_unfit(settings, "beat")
