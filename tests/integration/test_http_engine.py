"""HTTP steps through the engine: the small real agent service and real worker processes.

Each test launches a workflow with ``orch.launch`` and reads the outcome from the run's row;
the service runs in this process on a loopback port, so the test scripts what it says.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from tests.conftest import wait_for
from tests.integration.conftest import Stack
from tests.support.agent_service import AgentService
from tests.support.runs import finished, terminal_within_deadline

pytestmark = pytest.mark.integration

#: The bearer token; only the worker's environment holds it, under ``TOKEN_ENV``.
SECRET = "s3cret-engine-token-7c21"
TOKEN_ENV = "TEST_AGENT_TOKEN"
STACK_SETTINGS = {"ORCH_PROVIDER_SECRETS": '{"TEST_AGENT_TOKEN": ["127.0.0.1"]}'}
STATUS_MAP = {
    "queued": "pending",
    "working": "running",
    "done": "completed",
    "failed": "failed",
    "waiting": "input_required",
    "stopped": "cancelled",
}
#: Slack on ``deadline_at``: the test's own polling, and two processes' clocks.


@pytest.fixture(scope="module")
def worker(stack: Stack) -> ManagedProcess:
    """The module's worker, with the service's token in its environment (and nowhere else)."""
    stack.env[TOKEN_ENV] = SECRET
    return stack.start_worker()


@pytest.fixture
def service() -> Iterator[AgentService]:
    running = AgentService().start()
    yield running
    running.stop()


def flow(service: AgentService, task: Any = "hello", **options: Any) -> dict[str, Any]:
    return {
        "name": "http",
        "steps": [
            {
                "id": "s1",
                "provider": "http",
                "task": task,
                "timeout": 60,
                "poll_interval": 0.2,
                "max_poll_interval": 1.0,
                "with": {
                    "start": {"url": f"{service.url}/runs", "body": {"task": "{task}"}},
                    "status": {"url": f"{service.url}/runs/{{run_id}}"},
                    "cancel": {"url": f"{service.url}/runs/{{run_id}}/cancel"},
                    "run_id_path": "data.id",
                    "status_path": "state",
                    "output_path": "result",
                    "error_path": "failure.message",
                    "prompt_path": "question",
                    "status_map": STATUS_MAP,
                    **options,
                },
            }
        ],
    }


def test_step_completes_with_the_services_answer(
    service: AgentService, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(flow(service, {"goal": "{{ args.goal }}"}), {"goal": "ship"}, owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.stop_reason, done.error) == ("completed", "completed", None)
    assert done.result == {"echo": {"goal": "ship"}}
    only = done.steps[0]
    assert (only.status, only.last_provider_status) == ("completed", "done")
    assert service.start_calls == 1
    assert [(t.run_id, t.key) for t in service.turns.values()] == [
        (only.provider_run_id, only.idempotency_key)
    ]


def test_status_word_not_in_the_map_fails_the_step_naming_it(
    service: AgentService, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    service.script = [("working", 0.3), ("exploded", 0)]
    run = orch.launch(flow(service), owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.stop_reason) == ("failed", "step_failed")
    for error in (done.error, done.steps[0].error):
        assert "said 'exploded', which status_map does not know" in (error or ""), error
        assert "known words: done, failed, queued, stopped, waiting, working" in (error or "")
    assert done.steps[0].status == "failed"


def test_hanging_service_parks_the_run_then_its_budget_ends_it(
    service: AgentService,
    beat: ManagedProcess,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    service.script = [("working", 120), ("done", 0)]
    run = orch.launch(flow(service), owner=owner)
    wait_for(
        lambda: orch.get(run.id, owner=owner).steps[0].last_provider_status == "working",
        20,
        what="the turn is working",
    )
    service.hang = 60  # every request now waits far past ORCH_PROVIDER_TIMEOUT
    began = time.monotonic()
    parked = wait_for(
        lambda: (r := orch.get(run.id, owner=owner)).status == "parked" and r,
        15,
        what="the run parks while the service hangs",
    )
    assert parked.park_reason == "platform_interrupt"
    # The call's bound: what was left of the execution's one budget when the call began.
    said = re.search(r"no answer within ([0-9.]+)s", parked.steps[0].error or "")
    assert said is not None, parked.steps[0].error
    assert 0 < float(said.group(1)) <= stack.settings.provider_timeout, parked.steps[0].error

    budget = stack.settings.park_budget_platform_interrupt
    done, seen = terminal_within_deadline(orch, run.id, owner, timeout=budget + 15, live=parked)
    assert (done.status, done.stop_reason) == ("timed_out", "park_expired"), done.error
    assert "platform_interrupt" in (done.error or ""), done.error
    assert done.steps[0].status not in ("running", "parked")
    assert seen[0] == ("parked", "platform_interrupt"), seen
    print(f"hang-to-terminal: {time.monotonic() - began:.1f}s (park budget {budget}s)")


def test_secret_header_never_appears_in_the_record_or_events(
    service: AgentService, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    service.token = SECRET
    auth = {"Authorization": {"env": TOKEN_ENV, "prefix": "Bearer "}}
    accepted = orch.launch(flow(service, headers=auth), owner=owner)
    done = finished(orch, accepted.id, owner)
    assert (done.status, done.result) == ("completed", {"echo": "hello"})

    # Mid-turn the service starts wanting another token, and echoes the one it got in its 401.
    service.script = [("working", 120), ("done", 0)]
    refused = orch.launch(flow(service, headers=auth), owner=owner)
    wait_for(
        lambda: orch.get(refused.id, owner=owner).steps[0].last_provider_status == "working",
        20,
        what="the turn is working",
    )
    service.token = "another-token"
    failed = finished(orch, refused.id, owner)
    assert (failed.status, failed.stop_reason) == ("failed", "step_failed")
    assert "answered 401" in (failed.error or "") and "bad credentials" in (failed.error or "")
    assert "Bearer ***" in (failed.error or ""), failed.error

    for run_id in (accepted.id, refused.id):
        record = orch.get(run_id, owner=owner).model_dump_json()
        events = json.dumps(orch.events(run_id, owner=owner), default=str)
        explained = json.dumps(orch.explain(run_id, owner=owner), default=str)
        assert SECRET not in record
        assert SECRET not in events
        assert SECRET not in explained
        assert TOKEN_ENV in record  # the options name the variable, not its value
    assert SECRET not in worker.log()


# Regression: a refused first start once left the run 'queued' (stale step in close_run).
def test_start_refused_by_the_service_fails_the_step_naming_the_refusal(
    service: AgentService, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    service.start_status = 400
    run = orch.launch(flow(service), owner=owner)
    # A refusal is decided by the first execution; 5 s is generous.
    done = finished(orch, run.id, owner, timeout=5)
    assert (done.status, done.stop_reason) == ("failed", "step_failed")
    assert "answered 400" in (done.error or ""), done.error
    assert "start refused by the knob" in (done.steps[0].error or ""), done.steps[0].error
