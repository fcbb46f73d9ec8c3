"""A2A steps through the engine: the a2a-sdk's own server and real worker processes.

Each test launches a workflow with ``orch.launch`` and reads the outcome from the run's row
and, for what the issue asks of the agent's side, from what the agent's executor was sent.
The agent runs in this process on a loopback port.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from chaos.duplicating import DuplicatingQueue
from orchestration.core.db import session_scope, utcnow
from orchestration.providers.a2a import context_id
from orchestration.runtime.celery_queue import client_queue
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator, is_terminal
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from tests.conftest import wait_for
from tests.integration.conftest import Stack
from tests.support.a2a_agent import A2AAgent
from tests.support.runs import finished

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def agent() -> Iterator[A2AAgent]:
    running = A2AAgent().start()
    yield running
    running.stop()


def flow(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": "a2a", "steps": list(steps)}


def step(agent: A2AAgent, task: Any = "hello", *, id: str = "s1") -> dict[str, Any]:
    return {
        "id": id,
        "provider": "a2a",
        "task": task,
        "timeout": 60,
        "poll_interval": 0.2,
        "max_poll_interval": 1.0,
        "with": {"url": agent.url, "skill": "echo"},
    }


def messages_to(agent: A2AAgent, task_id: str | None) -> list[str]:
    return [message for task, _ctx, message in agent.executor.received if task == task_id]


def test_step_completes_with_the_agents_artifact(
    agent: A2AAgent, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    task = {"do": "complete", "text": "{{ args.what }}", "data": {"ok": True}}
    run = orch.launch(flow(step(agent, task)), {"what": "shipped"}, owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.stop_reason, done.error) == ("completed", "completed", None)
    assert done.result == ["shipped", {"ok": True}]
    only = done.steps[0]
    assert (only.status, only.last_provider_status) == ("completed", "TASK_STATE_COMPLETED")
    assert agent.tasks_in(context_id(only.idempotency_key or "")) == [only.provider_run_id]


def test_a_file_the_agent_answers_is_stored_by_hash_and_read_back_through_the_api(
    agent: A2AAgent, stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    text = "r\u00e9sum\u00e9 \u2713 line\n" * 300
    sent = text.encode()
    sha256 = hashlib.sha256(sent).hexdigest()
    task = {"do": "complete", "text": "see the file", "file": text, "file_name": "cv.txt"}
    run = orch.launch(flow(step(agent, task)), owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.stop_reason, done.error) == ("completed", "completed", None)
    reference = {"name": "cv.txt", "media_type": "text/plain", "sha256": sha256, "size": len(sent)}
    assert done.result == ["see the file", {"file": reference}]
    with session_scope(stack.settings.database_url) as session:
        token = tokens.create(session, owner, "t", now=utcnow())
        theirs = tokens.create(session, owner + "-other", "t", now=utcnow())
    client = TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"})
    record = client.get(f"/runs/{run.id}").json()
    assert record["steps"][0]["output"] == ["see the file", {"file": reference}]
    assert "base64" not in json.dumps(record)
    reply = client.get(f"/artifacts/{sha256}")
    assert reply.status_code == 200
    assert reply.content == sent
    assert reply.headers["content-type"].startswith("text/plain")
    other = client.get(f"/artifacts/{sha256}", headers={"Authorization": f"Bearer {theirs}"})
    assert other.status_code == 404


def test_input_required_parks_for_a_human_and_the_answer_resumes_the_task(
    agent: A2AAgent, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(flow(step(agent, {"do": "ask", "question": "which region?"})), owner=owner)
    parked = wait_for(
        lambda: ((r := orch.get(run.id, owner=owner)).status == "parked" or is_terminal(r)) and r,
        20,
        what="the run parks (or ends)",
    )
    assert (parked.status, parked.park_reason) == ("parked", "human"), parked.error
    asked = parked.steps[0]
    assert (asked.prompt, asked.last_provider_status) == (
        "which region?",
        "TASK_STATE_INPUT_REQUIRED",
    )

    orch.answer(run.id, "s1", "eu-west", owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.result) == ("completed", {"answer": "eu-west"})
    last = done.steps[0]
    assert (last.attempt, last.provider_run_id) == (2, asked.provider_run_id)
    assert len(messages_to(agent, asked.provider_run_id)) == 2, "the question, then the answer"
    assert agent.tasks_in(context_id(last.idempotency_key or "")) == []


def test_a_failed_task_fails_the_step_with_the_agents_words(
    agent: A2AAgent, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(flow(step(agent, {"do": "fail", "reason": "quota spent"})), owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.stop_reason) == ("failed", "step_failed")
    assert "the agent failed the task: quota spent" in (done.error or ""), done.error
    assert done.steps[0].last_provider_status == "TASK_STATE_FAILED"


def test_cancel_cancels_the_agents_task(
    agent: A2AAgent, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(flow(step(agent, {"do": "work"})), owner=owner)
    working = wait_for(
        lambda: (
            (r := orch.get(run.id, owner=owner)).steps[0].last_provider_status
            == "TASK_STATE_WORKING"
            and r
        ),
        20,
        what="the agent's task works",
    )
    task_id = working.steps[0].provider_run_id
    cancelled = orch.cancel(run.id, owner=owner)
    assert (cancelled.status, cancelled.stop_reason) == ("cancelled", "cancel_requested")
    assert agent.executor.cancelled.count(task_id) == 1


def test_tasks_delivered_twice_make_one_agent_task_per_turn(
    agent: A2AAgent, worker: ManagedProcess, stack: Stack, owner: str
) -> None:
    twice = Orchestrator(stack.settings, DuplicatingQueue(client_queue(stack.settings)))
    run = twice.launch(
        flow(
            step(agent, {"do": "complete", "seconds": 0.5, "text": "first"}, id="a"),
            step(agent, {"do": "ask", "question": "{{ steps.a.output }}?"}, id="b"),
        ),
        owner=owner,
    )
    wait_for(
        lambda: (r := twice.get(run.id, owner=owner)).park_reason == "human" and r,
        30,
        what="step b parked for a human",
    )
    twice.answer(run.id, "b", "ok", owner=owner)  # the resume goes out twice too
    done = finished(twice, run.id, owner)
    assert (done.status, done.result) == ("completed", {"answer": "ok"})
    first, second = done.steps
    assert agent.tasks_in(context_id(first.idempotency_key or "")) == [first.provider_run_id]
    assert agent.tasks_in(context_id(f"{run.id}:b:1")) == [second.provider_run_id]
    assert len(messages_to(agent, second.provider_run_id)) == 2
