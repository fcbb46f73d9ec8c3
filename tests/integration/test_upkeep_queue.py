"""The sweeper passes on time behind any backlog of steps (chaos finding 12).

Beat sends its passes to the upkeep queue (``ORCH_UPKEEP_QUEUE``), which every worker of the
step queue consumes too. Here one real prefork worker of concurrency 1, started as every
deployment here starts its workers (``-Q ORCH_QUEUE``), holds a step queue of about 100 s of
work; a run whose chain was never sent still gets its dead heartbeat re-armed by the sweeper
within its bound while that backlog is there. On one queue, each pass waited behind the
backlog and expired after one interval: nothing swept until it drained.
"""

from __future__ import annotations

import time

import pytest
from kombu import Connection

from orchestration.runtime.broker_probe import queue_depth
from orchestration.runtime.celery_queue import client_app
from orchestration.runtime.processes import start_worker
from orchestration.service import Orchestrator
from tests.integration.conftest import Stack
from tests.support.slow_task import SLOW_TASK

pytestmark = pytest.mark.integration

#: The backlog: this many tasks of :data:`HOLD` seconds each, about 100 s for one process.
BACKLOG, HOLD = 400, 0.25

WORKFLOW = {
    "name": "behind-a-backlog",
    "steps": [
        {"id": "s1", "provider": "scripted", "task": "go", "with": {"states": [["completed"]]}}
    ],
}


def _purge(stack: Stack) -> None:
    with Connection(stack.settings.broker_url) as connection:  # type: ignore[no-untyped-call]
        connection.default_channel.queue_purge(stack.settings.queue)


def test_a_step_backlog_does_not_delay_the_sweeper(stack: Stack, owner: str) -> None:
    settings = stack.settings
    worker = start_worker(
        stack.env,
        stack.folder / "backlog-worker.log",
        concurrency=1,
        name=f"backlog-{settings.queue}",
        extra=("-Q", settings.queue, "--include", "tests.support.slow_task"),
    )
    stack.processes.append(worker)
    worker.wait_for_log("ready.", timeout=60)
    assert settings.upkeep_queue in worker.log(), "the worker consumes the upkeep queue"
    sender = client_app(settings)
    for _ in range(BACKLOG):
        sender.send_task(SLOW_TASK, args=(HOLD,), queue=settings.queue)
    try:
        stack.start_beat()
        # The run's rows are written, its chain never sent: only the sweeper moves it.
        run_id = Orchestrator(settings, None).launch(WORKFLOW, owner=owner).id
        launched = time.monotonic()
        orch = stack.orchestrator()
        # Dead after the heartbeat timeout, re-armed by the next pass: a few intervals more.
        bound = settings.heartbeat_timeout + 10 * settings.sweep_interval + 10
        while orch.get(run_id, owner=owner).rearms == 0:
            assert time.monotonic() - launched < bound, (
                f"no sweeper pass re-armed the run within {bound}s behind the backlog"
            )
            time.sleep(0.2)
        waiting = queue_depth(settings)
        assert waiting is not None and waiting > BACKLOG // 4, (
            f"the backlog had drained ({waiting} left): this proves nothing"
        )
    finally:
        _purge(stack)
