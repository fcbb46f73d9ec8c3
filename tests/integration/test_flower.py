"""Flower against the deployment's broker: the step tasks of a run show up with their run and
step in ``args`` (the dispatcher's ``argsrepr``), and a cancelled run's task shows as revoked.

Needs ``flower`` (``pip install flower``); skipped without it unless ``CI=true``.
"""

from __future__ import annotations

import importlib.util
import secrets
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from orchestration.runtime.processes import ManagedProcess, celery_argv
from orchestration.service import Orchestrator, is_terminal
from tests.conftest import IN_CI, wait_for
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Flower:
    """A Flower process and a client for its HTTP API (basic auth, loopback only)."""

    def __init__(self, url: str, auth: tuple[str, str]) -> None:
        self.url = url
        self.auth = auth

    def tasks(self) -> dict[str, dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/tasks", auth=self.auth, timeout=10)
        response.raise_for_status()
        tasks: dict[str, dict[str, Any]] = response.json()
        return tasks


@pytest.fixture(scope="module")
def flower(stack: Stack, worker: ManagedProcess) -> Iterator[Flower]:
    if importlib.util.find_spec("flower") is None:
        if IN_CI:
            pytest.fail("CI=true but flower is not installed (pip install flower)")
        pytest.skip("flower is not installed (pip install flower)")
    port = _free_port()
    auth = ("ops", secrets.token_urlsafe(12))
    process = ManagedProcess(
        celery_argv(
            f"--broker={stack.settings.broker_url}",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
            f"--basic_auth={auth[0]}:{auth[1]}",
        ),
        stack.env,
        stack.folder / "flower.log",
    )
    stack.processes.append(process)
    client = Flower(f"http://127.0.0.1:{port}", auth)

    def up() -> bool:
        try:
            return httpx.get(f"{client.url}/healthcheck", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up, 30, interval=0.2, what="flower listening")
    yield client
    process.stop()
    stack.processes.remove(process)


def _flow(states: list[list[Any]], steps: int = 1) -> dict[str, Any]:
    return {
        "name": "flower",
        "steps": [
            {
                "id": f"s{index}",
                "provider": "scripted",
                "task": "go",
                "poll_interval": 0.1,
                "max_poll_interval": 0.3,
                "with": {"states": states},
            }
            for index in range(steps)
        ],
    }


def _events_flowing(flower: Flower, orch: Orchestrator, owner: str) -> None:
    """Flower answers HTTP before its event receiver has subscribed; events sent before that
    are lost to it. Launch small runs until Flower reports one's task."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        probe = orch.launch(_flow([["completed"]]), owner=owner)
        task_id = str(probe.steps[0].celery_task_id)
        retry_at = time.monotonic() + 3
        while time.monotonic() < retry_at:
            if task_id in flower.tasks():
                return
            time.sleep(0.2)
    pytest.fail("flower never received task events from the worker")


def _settled(flower: Flower, expected: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Flower's tasks once each task id in ``expected`` has its expected state (20 s)."""
    deadline = time.monotonic() + 20
    while True:
        tasks = flower.tasks()
        states = {task_id: tasks.get(task_id, {}).get("state") for task_id in expected}
        if states == expected:
            return tasks
        if time.monotonic() > deadline:
            pytest.fail(f"flower's states after 20 s: {states}, expected {expected}")
        time.sleep(0.3)


def test_flower_sees_step_tasks_and_a_revoke(
    flower: Flower, orch: Orchestrator, owner: str
) -> None:
    _events_flowing(flower, orch, owner)
    done = orch.launch(_flow([["running", 0.2], ["completed"]], steps=2), owner=owner)
    stopped = orch.launch(_flow([["running"]], steps=2), owner=owner)
    wait_for(lambda: orch.get(stopped.id, owner=owner).steps[0].polls >= 2, 20, what="polling")
    cancelled = orch.cancel(stopped.id, owner=owner)
    assert cancelled.status == "cancelled"
    wait_for(lambda: is_terminal(orch.get(done.id, owner=owner)), 20, what="run done")
    record = orch.get(done.id, owner=owner)
    assert record.status == "completed"

    expected = {str(step.celery_task_id): "SUCCESS" for step in record.steps}
    expected[str(cancelled.steps[0].celery_task_id)] = "REVOKED"
    tasks = _settled(flower, expected)
    for index, step in enumerate(record.steps):
        task = tasks[str(step.celery_task_id)]
        assert task["name"] == "orchestration.step.advance"
        assert task["state"] == "SUCCESS"
        # The first message carries the dispatcher's argsrepr; a poll re-sent by
        # ``self.retry`` carries Celery's own repr of the same arguments.
        assert task["args"] in (f"(run={done.id}, step={index})", repr((done.id, index))), task
    revoked = tasks[str(cancelled.steps[0].celery_task_id)]
    assert (revoked["name"], revoked["state"]) == ("orchestration.step.advance", "REVOKED")
    assert stopped.id in revoked["args"]


def test_a_cancel_the_step_honours_itself_shows_as_revoked(
    flower: Flower, orch: Orchestrator, owner: str
) -> None:
    """A graceful cancel sends no revoke: the step task honours the request at its next
    execution. Flower must still end the task as revoked, not leave it started for ever;
    the same holds when a hard cancel's request is honoured before its revoke arrives."""
    _events_flowing(flower, orch, owner)
    run = orch.launch(_flow([["running"]]), owner=owner)
    wait_for(lambda: orch.get(run.id, owner=owner).steps[0].polls >= 2, 20, what="polling")
    orch.cancel(run.id, owner=owner, graceful=True)
    wait_for(lambda: is_terminal(orch.get(run.id, owner=owner)), 20, what="cancel honoured")
    record = orch.get(run.id, owner=owner)
    assert (record.status, record.stop_reason) == ("cancelled", "cancel_requested")
    task_id = str(record.steps[0].celery_task_id)
    task = _settled(flower, {task_id: "REVOKED"})[task_id]
    assert task["name"] == "orchestration.step.advance"
