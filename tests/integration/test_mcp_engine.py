"""MCP steps through the engine: the mcp package's own server and real worker processes.

Each test launches a workflow with ``orch.launch`` and reads the outcome from the run's row
and, for what the issue asks of the server's side, from what the server counted (calls, and
tasks made per tool) or what it says of the step's task now. The servers run in this process
on loopback ports: one runs tool calls as tasks, one does not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from chaos.duplicating import DuplicatingQueue
from orchestration.providers.base import ProviderStatus, TurnRef
from orchestration.providers.mcp import MCPProvider
from orchestration.runtime.celery_queue import client_queue
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator, is_terminal
from tests.conftest import wait_for
from tests.integration.conftest import Stack
from tests.support.mcp_server import MCPServer, mcp_server_url, start_mcp_server
from tests.support.runs import finished

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[MCPServer]:
    running = start_mcp_server()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def plain() -> Iterator[str]:
    """The URL of a server without tasks."""
    with mcp_server_url(tasks=False) as url:
        yield url


def flow(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": "mcp", "steps": list(steps)}


def step(server: MCPServer | str, tool: str, task: Any, *, id: str = "s1") -> dict[str, Any]:
    return {
        "id": id,
        "provider": "mcp",
        "task": task,
        "timeout": 60,
        "poll_interval": 0.2,
        "max_poll_interval": 1.0,
        "with": {"url": server if isinstance(server, str) else server.url, "tool": tool},
    }


def test_a_task_completes_with_the_tools_structured_content(
    server: MCPServer, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    before = server.made["work"]
    task = {"seconds": 0.5, "text": "{{ args.what }}"}
    run = orch.launch(flow(step(server, "work", task)), {"what": "shipped"}, owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.stop_reason, done.error) == ("completed", "completed", None)
    assert done.result == {"text": "shipped", "seconds": 0.5}
    assert done.steps[0].last_provider_status == "completed"
    assert server.made["work"] == before + 1


def test_a_tool_error_fails_the_step_with_the_tools_words(
    server: MCPServer, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(flow(step(server, "fail", {"message": "quota spent"})), owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.stop_reason) == ("failed", "step_failed")
    assert "the tool failed: quota spent" in (done.error or ""), done.error


def test_a_task_that_asks_parks_and_the_answer_resumes_it(
    server: MCPServer, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(flow(step(server, "ask", {"question": "which region?"})), owner=owner)
    parked = wait_for(
        lambda: ((r := orch.get(run.id, owner=owner)).status == "parked" or is_terminal(r)) and r,
        20,
        what="the run parks (or ends)",
    )
    assert (parked.status, parked.park_reason) == ("parked", "human"), parked.error
    asked = parked.steps[0]
    assert (asked.prompt, asked.last_provider_status) == ("which region?", "input_required")
    task_id = json.loads(asked.provider_run_id or "{}")["task"]

    orch.answer(run.id, "s1", "eu-west", owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.result) == ("completed", "eu-west"), done.error
    last = done.steps[0]
    assert (last.attempt, last.provider_run_id) == (2, asked.provider_run_id)
    answered = [r for r in server.replies if str(r.get("id")).startswith(f"task-{task_id}-")]
    assert [r["result"] for r in answered] == [
        {"action": "accept", "content": {"answer": "eu-west"}}
    ]


def test_cancel_cancels_the_servers_task(
    server: MCPServer, worker: ManagedProcess, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(flow(step(server, "work", {"seconds": 600})), owner=owner)
    working = wait_for(
        lambda: (
            (r := orch.get(run.id, owner=owner)).steps[0].last_provider_status == "working" and r
        ),
        20,
        what="the server's task works",
    )
    cancelled = orch.cancel(run.id, owner=owner)
    assert (cancelled.status, cancelled.stop_reason) == ("cancelled", "cancel_requested")
    options = {"url": server.url, "tool": "work"}
    where = TurnRef(
        working.steps[0].idempotency_key or "", working.steps[0].provider_run_id, options
    )
    assert MCPProvider(stack.settings).status(where).status is ProviderStatus.CANCELLED


def test_a_server_without_tasks_answers_the_call_or_fails_it_at_the_deadline(
    plain: str, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(flow(step(plain, "work", {"seconds": 0.2, "text": "sync"})), owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.result) == ("completed", {"text": "sync", "seconds": 0.2})

    slow = orch.launch(flow(step(plain, "work", {"seconds": 30})), owner=owner)
    failed = finished(orch, slow.id, owner)
    assert (failed.status, failed.stop_reason) == ("failed", "step_failed")
    assert "ORCH_PROVIDER_TIMEOUT" in (failed.error or ""), failed.error


def test_tasks_delivered_twice_make_one_server_task_per_turn(
    server: MCPServer, worker: ManagedProcess, stack: Stack, owner: str
) -> None:
    twice = Orchestrator(stack.settings, DuplicatingQueue(client_queue(stack.settings)))
    before = server.made["work"]
    run = twice.launch(
        flow(
            step(server, "work", {"seconds": 0.5, "text": "first"}, id="a"),
            step(server, "work", {"seconds": 0.3, "text": "{{ steps.a.output.text }}!"}, id="b"),
        ),
        owner=owner,
    )
    done = finished(twice, run.id, owner)
    assert (done.status, done.result) == ("completed", {"text": "first!", "seconds": 0.3})
    assert server.made["work"] == before + 2
