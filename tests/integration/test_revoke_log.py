"""A cancel revokes the run's Celery tasks, and the worker's log stays clean.

Celery's revoke handler asks the result backend for the state of every revoked task that is
not executing (``celery.worker.control._revoke``); with no backend configured it logged
"Failed to mark task … as revoked in backend: No result backend is configured" at every
cancel (issue 15). The configured ``NoResultBackend`` keeps nothing and answers ``PENDING``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.runtime.celery_queue import client_queue
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from orchestration.workflows import load_file
from tests.conftest import wait_for
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parents[2] / "orchestration" / "examples"


def test_a_cancel_leaves_no_backend_warning_in_the_worker_log(
    stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    record = orch.launch(load_file(EXAMPLES / "endless.yaml"), owner=owner)
    wait_for(lambda: orch.get(record.id, owner=owner).steps[0].polls >= 2, 30, what="polling")
    cancelled = orch.cancel(record.id, owner=owner)
    assert cancelled.status == "cancelled"
    # Remote-control commands are handled in order: once the worker lists the run's tasks as
    # revoked, it has handled the revoke, and any warning about it is in the log.
    control = client_queue(stack.settings).app.control
    wait_for(
        lambda: (
            set(cancelled.task_ids)
            <= {
                task_id
                for revoked in (control.inspect(timeout=1.0).revoked() or {}).values()
                for task_id in revoked
            }
        ),
        30,
        interval=0.5,
        what="the worker handled the revoke",
    )
    log = worker.log()
    assert "as revoked in backend" not in log, log[-3000:]
    assert "No result backend is configured" not in log
