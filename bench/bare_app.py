"""The benchmark worker's Celery app: the engine's own tasks plus bare baseline tasks.

    celery -A bench.bare_app worker -P prefork -c 2 ...

It *is* ``tasks.celery_app.app`` (same configuration: JSON, ``acks_late``, prefetch 1, no
result backend), with ``tasks.steps`` and ``tasks.sweeper`` imported and three bare tasks
added, so an engine step and its baseline run in the same worker processes under the same
flags. The bare tasks do nothing but what Celery itself does:

* ``bench.bare.noop``: return at once (a link of a bare chain);
* ``bench.bare.mark``: ``RPUSH`` the time to a Redis key (the end of a bare chain);
* ``bench.bare.loop``: ``self.retry(countdown=…)`` until a hop count or a deadline, exactly the
  way the step task polls.

With ``BENCH_TRACE_DIR`` set, every task execution appends one line to
``trace-<pid>.tsv`` there (name, task id, first arg, start, end, ETA, retries): how the
benchmark measures hop intervals, poll lateness and busy worker slots without touching the
engine's code. The cost is one buffered ``write`` per execution, the same for every task.
While ``publish.on`` exists there, every message a process publishes (a chain's next link, a
retry) is also appended to ``publish-<pid>.tsv`` with its JSON sizes (``bench.messages``).
"""

from __future__ import annotations

import os
import time
from typing import IO, Any

import redis
from celery import Task
from celery.signals import (
    before_task_publish,
    task_postrun,
    task_prerun,
    worker_process_shutdown,
)

# Imported for their side effect: they register the step and sweep tasks on ``app``.
import tasks.steps
import tasks.sweeper  # noqa: F401
from bench.names import LOOP, MARK, NOOP
from bench.trace import PUBLISH_ON, published
from tasks.celery_app import app, settings

__all__ = ["app"]

_TRACE_DIR = os.environ.get("BENCH_TRACE_DIR")
_trace: dict[str, Any] = {"pid": None, "file": None, "open": {}}
_redis: dict[int, redis.Redis] = {}


@app.task(name=NOOP, acks_late=True)
def noop() -> None:
    """A link of the bare chain."""


@app.task(name=MARK, acks_late=True)
def mark(key: str) -> None:
    """The last link of a bare chain: tell the benchmark when the chain ended."""
    pid = os.getpid()
    if pid not in _redis:
        _redis[pid] = redis.Redis.from_url(settings.broker_url)
    _redis[pid].rpush(key, repr(time.time()))


@app.task(bind=True, name=LOOP, acks_late=True, max_retries=None)
def loop(self: Task, countdown: float, hops: int = 0, until: float = 0.0, hop: int = 0) -> None:
    """Retry ``hops`` times (or until the epoch ``until``) with ``countdown``: a bare poll."""
    more = hop < hops if hops else time.time() < until
    if more:
        again = {"countdown": countdown, "hops": hops, "until": until, "hop": hop + 1}
        raise self.retry(countdown=countdown, kwargs=again, max_retries=None)


def _file() -> IO[str] | None:
    if not _TRACE_DIR:
        return None
    pid = os.getpid()
    if _trace["pid"] != pid:
        _trace["pid"] = pid
        # Line-buffered: a SIGKILLed child (a cancel's revoke) loses at most its last line.
        _trace["file"] = open(  # noqa: SIM115 - closed at process shutdown
            os.path.join(_TRACE_DIR, f"trace-{pid}.tsv"), "a", buffering=1
        )
    file: IO[str] = _trace["file"]
    return file


@task_prerun.connect
def _started(task_id: str | None = None, **_: Any) -> None:
    if _TRACE_DIR and task_id is not None:
        _trace["open"][task_id] = time.time()


@task_postrun.connect
def _finished(
    task_id: str | None = None,
    task: Task | None = None,
    args: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    file = _file()
    if file is None or task_id is None or task is None:
        return
    started = _trace["open"].pop(task_id, None)
    if started is None:
        return
    request = task.request
    first = str(args[0]) if args else ""
    eta = request.eta or ""
    file.write(
        f"{task.name}\t{task_id}\t{first}\t{started:.6f}\t{time.time():.6f}\t{eta}\t"
        f"{request.retries or 0}\t{state or ''}\n"
    )


@before_task_publish.connect
def _publishing(sender: Any = None, body: Any = None, headers: Any = None, **_: Any) -> None:
    if not _TRACE_DIR or not os.path.exists(os.path.join(_TRACE_DIR, PUBLISH_ON)):
        return
    path = os.path.join(_TRACE_DIR, f"publish-{os.getpid()}.tsv")
    with open(path, "a") as file:
        file.write(published(sender, body, headers).line())


@worker_process_shutdown.connect
def _close(**_: Any) -> None:
    file = _trace.get("file")
    if file is not None:
        file.close()
