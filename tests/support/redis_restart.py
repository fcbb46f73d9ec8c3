"""A worker of ``tests/support/redis_restart_app.py`` on a private Redis, for
``tests/integration/test_redis_restart.py``.

Kept apart from the app module, which configures a Celery app when imported: the test process
imports only this one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from chaos.services import PrivateRedis
from orchestration.runtime.processes import ManagedProcess

#: Set to ``1`` to run the worker with kombu's own ``Channel._connparams``, as it was before
#: :func:`~orchestration.runtime.celery_config.survive_redis_restarts`: the test shows the crash.
WITHOUT_WORKAROUND = "ORCH_TEST_WITHOUT_KOMBU_WORKAROUND"

#: The app's tasks: append a line to a file, at once or after a pause.
MARK_TASK = "tests.redis_restart.mark"
SLOW_MARK_TASK = "tests.redis_restart.slow_mark"

#: The queue the worker consumes (its ``ORCH_QUEUE``).
QUEUE = "redis-restart"


@contextmanager
def running_worker(
    server: PrivateRedis, folder: Path, *, workaround: bool, concurrency: int = 1
) -> Iterator[ManagedProcess]:
    """A ready prefork worker of the app on ``server`` (the flags of ``start_worker``,
    ``concurrency`` processes), logging to ``folder/worker.log``; stopped on exit."""
    env = {
        **os.environ,
        "ORCH_BROKER_URL": server.url,
        "ORCH_QUEUE": QUEUE,
        "ORCH_DATABASE_URL": f"sqlite:///{folder / 'unused.db'}",
    }
    env.pop(WITHOUT_WORKAROUND, None)
    if not workaround:
        env[WITHOUT_WORKAROUND] = "1"
    argv = [sys.executable, "-m", "celery", "-A", "tests.support.redis_restart_app", "worker"]
    argv += ["-P", "prefork", "-c", str(concurrency), "--without-mingle", "--without-gossip"]
    argv += ["-E", "-l", "INFO"]
    worker = ManagedProcess(argv, env, folder / "worker.log")
    try:
        worker.wait_for_log("ready.", timeout=60)
        yield worker
    finally:
        worker.stop()
