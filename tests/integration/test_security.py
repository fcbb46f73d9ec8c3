"""Messages are JSON only: a pickle message is refused by a real worker and moves nothing."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from orchestration.providers.scripted import ScriptedProvider
from orchestration.runtime.celery_config import STEP_TASK
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from tests.conftest import wait_for
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

WORKFLOW = {
    "name": "sec",
    "steps": [
        {
            "id": "s1",
            "provider": "scripted",
            "task": "go",
            "poll_interval": 0.1,
            "max_poll_interval": 0.5,
            "with": {"states": [["completed"]]},
        }
    ],
}


def send_raw(stack: Stack, run_id: str, serializer: str, **conf: Any) -> str:
    """Publish a step message the way an attacker (or a misconfigured client) would."""
    sender = Celery("raw-sender", broker=stack.settings.broker_url, set_as_current=False)
    sender.conf.update(task_serializer=serializer, accept_content=[serializer], **conf)
    result = sender.send_task(
        STEP_TASK,
        args=(run_id, 0),
        kwargs={"tick": 0},
        queue=stack.settings.queue,
        serializer=serializer,
    )
    return str(result.id)


def written_not_sent(stack: Stack, owner: str) -> str:
    """A run whose rows exist but whose chain was never sent (no dispatcher)."""
    return Orchestrator(stack.settings, None).launch(WORKFLOW, owner=owner).id


def test_pickle_message_is_refused_and_moves_nothing(
    stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run_id = written_not_sent(stack, owner)
    send_raw(stack, run_id, "pickle")
    wait_for(
        lambda: "Refusing to deserialize untrusted content of type pickle" in worker.log(),
        20,
        what="the worker's refusal",
    )
    record = orch.get(run_id, owner=owner)
    assert (record.status, record.steps[0].polls) == ("queued", 0)
    assert ScriptedProvider(stack.settings).start_calls(run_id + ":") == []


def test_json_message_for_the_same_run_is_accepted(
    stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run_id = written_not_sent(stack, owner)
    send_raw(stack, run_id, "json")
    wait_for(lambda: orch.get(run_id, owner=owner).status == "completed", 20, what="completion")
