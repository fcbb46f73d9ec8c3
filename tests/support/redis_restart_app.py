"""The smallest worker app that shows kombu 5.7.0 crashing on a Redis restart.

``celery -A tests.support.redis_restart_app worker`` runs the project's Celery configuration
(:func:`orchestration.celery_config.configure`, so ``task_acks_late`` and the kombu workaround
as deployed) with one task that needs no database: :func:`mark` appends a line to a file, so a
test sees that the worker still consumes. ``tests/integration/test_redis_restart.py`` uses it.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

from celery import Celery
from kombu.transport import redis as kombu_redis

from orchestration.celery_config import configure
from orchestration.settings import get_settings

#: Set to ``1`` to run the worker with kombu's own ``QoS.restore_unacked``, as it was before
#: :func:`~orchestration.celery_config.survive_redis_restarts`: the test shows the crash.
WITHOUT_WORKAROUND = "ORCH_TEST_WITHOUT_KOMBU_WORKAROUND"

#: The task's name (the test sends it by name, without importing this module).
MARK_TASK = "tests.redis_restart.mark"

app = configure(Celery("redis_restart"), get_settings())
if os.environ.get(WITHOUT_WORKAROUND) == "1":
    kombu_redis.QoS.restore_unacked = inspect.unwrap(kombu_redis.QoS.restore_unacked)


@app.task(name=MARK_TASK)
def mark(path: str, line: str) -> None:
    """Append ``line`` to the file at ``path``."""
    with Path(path).open("a") as out:
        out.write(line + "\n")
