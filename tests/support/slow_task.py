"""A task that only sleeps: a worker started with ``--include tests.support.slow_task`` can be
given a backlog of them on the step queue (``tests/integration/test_upkeep_queue.py``)."""

from __future__ import annotations

import time

from tasks.celery_app import app

SLOW_TASK = "tests.support.slow_task.sleep"


@app.task(name=SLOW_TASK, acks_late=True, ignore_result=True)
def sleep(seconds: float) -> None:
    """Hold a pool process for ``seconds``, as a step waiting on its provider does."""
    time.sleep(seconds)
