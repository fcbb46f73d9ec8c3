"""The smallest worker app that shows kombu 5.7.0 crashing on a Redis restart.

``celery -A tests.support.redis_restart_app worker`` (see :mod:`tests.support.redis_restart`)
runs the project's Celery configuration (:func:`orchestration.runtime.celery_config.configure`, so
``task_acks_late`` and the kombu workaround as deployed) with one task that needs no database:
:func:`mark` appends a line to a file, so a test sees that the worker still consumes.
"""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path

from celery import Celery
from kombu.transport import redis as kombu_redis

from orchestration.core.settings import get_settings
from orchestration.runtime.celery_config import configure
from tests.support.redis_restart import MARK_TASK, SLOW_MARK_TASK, WITHOUT_WORKAROUND

app = configure(Celery("redis_restart"), get_settings())
if os.environ.get(WITHOUT_WORKAROUND) == "1":
    original = inspect.unwrap(kombu_redis.Channel._connparams)
    kombu_redis.Channel._connparams = original  # type: ignore[method-assign]


@app.task(name=MARK_TASK)  # type: ignore[untyped-decorator]
def mark(path: str, line: str) -> None:
    """Append ``line`` to the file at ``path``."""
    with Path(path).open("a") as out:
        out.write(line + "\n")


@app.task(name=SLOW_MARK_TASK)  # type: ignore[untyped-decorator]
def slow_mark(path: str, line: str, seconds: float) -> None:
    """Append ``line`` after ``seconds``: a task still running when Redis goes, acknowledged
    (``task_acks_late``) after the connection was released."""
    time.sleep(seconds)
    mark(path, line)
