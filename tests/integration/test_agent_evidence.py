"""Agents by name, and what each step ran on (issue 32), through real worker processes and
the a2a-sdk's own server on loopback.

The deployment refuses raw URLs (``ORCH_ALLOW_RAW_URLS=false``, the default): steps reach
the agent only through the registry. Each step records the agent card's name, version and
skill at launch and at its start; a pinned step whose agent's card states another version by
the time it starts fails ``agent_changed`` and sends the agent nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from orchestration.core.db import utcnow
from orchestration.core.errors import PermanentProviderError, ValidationError
from orchestration.core.followups import Done
from orchestration.core.settings import Settings
from orchestration.providers.a2a import context_id
from orchestration.providers.http import HttpProvider
from orchestration.runtime.executor import Executor
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from orchestration.workflows import agents
from tests.integration.conftest import Stack
from tests.support.a2a_agent import A2AAgent
from tests.support.runs import finished

pytestmark = pytest.mark.integration

STACK_SETTINGS = {"ORCH_ALLOW_RAW_URLS": "false"}


@pytest.fixture(scope="module")
def agent(stack: Stack) -> Iterator[A2AAgent]:
    running = A2AAgent().start()
    settings = stack.settings
    transact = Executor(settings, None)
    for name, pin in (("research", False), ("research-pinned", True)):
        entry = agents.Entry(name, "a2a", running.url, options={"skill": "echo"}, pin=pin)
        transact(lambda session, e=entry: Done(agents.add(session, settings, e, utcnow())))
    yield running
    running.stop()


def _step(name: str, task: Any, *, id: str = "s1") -> dict[str, Any]:
    return {"id": id, "agent": name, "task": task, "timeout": 60, "poll_interval": 0.2}


def test_a_step_names_an_agent_and_records_its_card_at_launch_and_start(
    agent: A2AAgent, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    flow = {"name": "by-name", "steps": [_step("research", {"do": "complete", "text": "hi"})]}
    run = orch.launch(flow, owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.result) == ("completed", "hi"), done.error
    seen = done.steps[0].evidence or {}
    card = {"name": "test-agent", "version": "1.0.0", "detail": {"skill": "echo"}}
    for moment in ("launch", "start"):
        assert {key: seen[moment][key] for key in card} == card, seen
    assert done.steps[0].provider == "a2a"
    assert agent.url not in str(done.workflow)
    told = orch.explain(run.id, owner=owner)["text"]
    assert "step 's1' at launch ran on 'test-agent' 1.0.0 (skill echo)" in told


def test_raw_urls_are_refused_by_default(agent: A2AAgent, orch: Orchestrator, owner: str) -> None:
    raw = {"id": "s1", "provider": "a2a", "task": "t", "with": {"url": agent.url}}
    with pytest.raises(ValidationError, match="ORCH_ALLOW_RAW_URLS") as caught:
        orch.launch({"name": "raw", "steps": [raw]}, owner=owner)
    assert caught.value.field == "steps[0].provider"


def test_a_pinned_agent_whose_card_changed_before_the_start_fails_agent_changed(
    agent: A2AAgent, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    # The first step holds the run for two seconds; the card changes meanwhile.
    hold = {
        "id": "hold",
        "provider": "scripted",
        "task": "wait",
        "with": {"states": [["running", 2], ["completed"]]},
        "poll_interval": 0.2,
    }
    pinned = _step("research-pinned", {"do": "complete", "text": "never"}, id="ask")
    run = orch.launch({"name": "pinned", "steps": [hold, pinned]}, owner=owner)
    agent.version = "2.0.0"
    try:
        done = finished(orch, run.id, owner)
    finally:
        agent.version = "1.0.0"
    assert (done.status, done.stop_reason) == ("failed", "agent_changed"), done.error
    assert "'1.0.0' at launch" in (done.error or ""), done.error
    assert "'2.0.0' at the step's start" in (done.error or ""), done.error
    asked = done.steps[1]
    assert (asked.status, asked.provider_run_id) == ("failed", None)
    assert (asked.evidence or {})["launch"]["version"] == "1.0.0"
    assert (asked.evidence or {})["start"]["version"] == "2.0.0"
    # The turn never began: the agent was sent nothing for it.
    assert agent.tasks_in(context_id(asked.idempotency_key or "")) == []
    assert not [
        m for m in agent.executor.received if m[1] == context_id(asked.idempotency_key or "")
    ]


def test_a_pinned_agent_that_did_not_change_runs(
    agent: A2AAgent, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    flow = {"name": "steady", "steps": [_step("research-pinned", {"do": "complete", "text": "ok"})]}
    done = finished(orch, orch.launch(flow, owner=owner).id, owner)
    assert (done.status, done.result) == ("completed", "ok"), done.error


class _Versioned(BaseHTTPRequestHandler):
    """A service whose ``GET /about`` states its version inside its JSON."""

    def do_GET(self) -> None:
        body = json.dumps({"build": {"version": "4.2"}} if self.path == "/about" else {}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def test_an_http_agent_states_its_version_at_the_path_its_spec_names() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Versioned)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        entry = agents.Entry("svc", "http", base)
        spec = {
            "start": {"url": "/runs"},
            "status": {"url": "/runs/{run_id}"},
            "cancel": {"url": "/runs/{run_id}/cancel"},
            "run_id_path": "id",
            "status_path": "status",
        }
        settings = Settings(provider_hosts="127.0.0.1", provider_timeout=3)
        http = HttpProvider(settings)

        def asking(path: str) -> dict[str, Any]:
            return agents.options(
                entry, {**spec, "version": {"url": "/about"}, "version_path": path}
            )

        seen = http.describe(asking("build.version"))
        assert (seen.version, seen.detail) == ("4.2", {"version_path": "build.version"})
        assert http.describe(agents.options(entry, spec)).version is None  # it names none
        with pytest.raises(PermanentProviderError, match=r"no version at 'build\.nope'"):
            http.describe(asking("build.nope"))
    finally:
        server.shutdown()
        server.server_close()
