"""Workers survive a Redis restart (issue 13).

On kombu 5.7.0 a Redis restart killed every worker that held an unacknowledged message (here a
countdown message, held under ``task_acks_late``): ``Unrecoverable error: AttributeError:
'NoneType' object has no attribute 'hostname'`` from ``QoS.restore_unacked``, see
``docs/operations.md`` ("Redis restarts and kombu 5.7.0"). ``configure`` carries the workaround
(:func:`orchestration.runtime.celery_config.survive_redis_restarts`).

Each test runs a real prefork worker of ``tests/support/redis_restart_app.py`` on a private
``redis-server`` without persistence, SIGKILLs Redis while the worker holds a countdown message
and waits in ``BRPOP``, waits until the worker has seen Redis go, and starts it again. With the
workaround the worker lives, reconnects and runs a task sent after the restart. Without it, on a
kombu release the workaround is for, the same sequence kills the worker. On any other release
the workaround is off, and the first test alone says whether that release still needs it. The
held message itself is lost with Redis's memory: what is claimed is that the worker does not
crash and keeps consuming.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest
import redis
from celery import Celery

from chaos.services import PrivateRedis
from orchestration.runtime.celery_config import KOMBU_CRASHING_ON_REDIS_RESTART
from orchestration.runtime.processes import ManagedProcess
from tests.conftest import IN_CI, wait_for
from tests.support.redis_restart import MARK_TASK, QUEUE, SLOW_MARK_TASK, running_worker

pytestmark = pytest.mark.integration

CONNECTION_LOST = "consumer: Connection to broker lost"
RECONNECTING = "consumer: Cannot connect to redis://"
CONNECTED = "Connected to redis://"
CRASH = "AttributeError: 'NoneType' object has no attribute 'hostname'"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A ``redis-server`` of this test alone, which it may stop and start."""
    if shutil.which("redis-server") is None:
        if IN_CI:
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    private = PrivateRedis(tmp_path)
    private.start()
    yield private
    private.stop()


def send_mark(server: PrivateRedis, path: Path, line: str, countdown: float = 0) -> None:
    """Send the test app's task by name, from a client of our own."""
    client = Celery("redis-restart-client", broker=server.url)
    try:
        client.send_task(MARK_TASK, args=(str(path), line), countdown=countdown, queue=QUEUE)
    finally:
        client.close()


def send_slow_mark(server: PrivateRedis, path: Path, line: str, seconds: float) -> None:
    client = Celery("redis-restart-client", broker=server.url)
    try:
        client.send_task(SLOW_MARK_TASK, args=(str(path), line, seconds), queue=QUEUE)
    finally:
        client.close()


def hold_a_countdown_message(server: PrivateRedis, path: Path) -> None:
    """Leave the worker holding one unacknowledged countdown message (kombu's ``unacked``)
    and blocked in its next ``BRPOP``, as a polling worker is when Redis goes: the reply its
    channel then waits for is what makes kombu's first close of it fail."""
    send_mark(server, path, "held", countdown=300)
    client = redis.Redis.from_url(server.url)
    wait_for(lambda: client.hlen("unacked") == 1, timeout=15, what="the worker to hold it")
    wait_for(
        lambda: any(c["cmd"] == "brpop" and "b" in c["flags"] for c in client.client_list()),
        timeout=15,
        what="the worker to wait in BRPOP",
    )
    client.close()


def stop_redis_under(worker: ManagedProcess, server: PrivateRedis) -> None:
    """SIGKILL Redis and wait until the worker has noticed (with Redis still down)."""
    server.kill()
    wait_for(
        lambda: CONNECTION_LOST in worker.log() or worker.proc.poll() is not None,
        timeout=15,
        what="the worker to see Redis go",
    )


def test_a_worker_survives_a_redis_restart_and_keeps_consuming(
    server: PrivateRedis, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    with running_worker(server, tmp_path, workaround=True) as worker:
        hold_a_countdown_message(server, marks)
        stop_redis_under(worker, server)
        # Its old connection is closed once it tries a new one; Redis is still down.
        wait_for(
            lambda: RECONNECTING in worker.log() or worker.proc.poll() is not None,
            timeout=15,
            what="the worker to try to reconnect",
        )
        assert worker.proc.poll() is None, worker.log()[-3000:]
        server.start()
        wait_for(lambda: worker.log().count(CONNECTED) >= 2, timeout=30, what="a reconnect")
        send_mark(server, marks, "after the restart")
        wait_for(
            lambda: marks.exists() and "after the restart" in marks.read_text(),
            timeout=30,
            what="the task sent after the restart to run",
        )
        assert worker.proc.poll() is None
        assert "Unrecoverable error" not in worker.log()


def test_a_task_that_ends_after_redis_went_is_acknowledged_without_killing_the_worker(
    server: PrivateRedis, tmp_path: Path
) -> None:
    """The second path: a task still running when Redis goes finishes after the connection was
    released, and its late ack builds a client from the detached transport."""
    marks = tmp_path / "marks.txt"
    with running_worker(server, tmp_path, workaround=True, concurrency=2) as worker:
        send_slow_mark(server, marks, "slow", seconds=3)
        wait_for(lambda: "slow_mark[" in worker.log(), timeout=15, what="the slow task to start")
        client = redis.Redis.from_url(server.url)
        wait_for(
            lambda: any(c["cmd"] == "brpop" and "b" in c["flags"] for c in client.client_list()),
            timeout=15,
            what="the worker's free slot to wait in BRPOP",
        )
        client.close()
        stop_redis_under(worker, server)
        wait_for(lambda: marks.exists(), timeout=15, what="the slow task to finish")
        # Its ack waits for the consumer's loop, which runs again once Redis is back: it is
        # made on the old, released channel.
        server.start()
        wait_for(
            lambda: "Couldn't ack" in worker.log() or worker.proc.poll() is not None,
            timeout=30,
            what="its late ack, on the released connection",
        )
        assert worker.proc.poll() is None, worker.log()[-3000:]
        send_mark(server, marks, "after the restart")
        wait_for(
            lambda: "after the restart" in marks.read_text(),
            timeout=30,
            what="the task sent after the restart to run",
        )
        assert "Unrecoverable error" not in worker.log()


@pytest.mark.skipif(
    kombu.__version__ not in KOMBU_CRASHING_ON_REDIS_RESTART,
    reason="the workaround is off on this kombu release",
)
def test_without_the_workaround_the_same_restart_kills_the_worker(
    server: PrivateRedis, tmp_path: Path
) -> None:
    with running_worker(server, tmp_path, workaround=False) as worker:
        hold_a_countdown_message(server, tmp_path / "marks.txt")
        stop_redis_under(worker, server)
        wait_for(lambda: worker.proc.poll() is not None, timeout=20, what="the worker to exit")
        log = worker.log()
        assert "Unrecoverable error" in log
        assert CRASH in log
        assert "in restore_unacked" in log
