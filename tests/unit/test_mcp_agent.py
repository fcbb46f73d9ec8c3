"""An MCP server as a registered agent (issue 32), end to end: the operator registers it with
``orchestration agents add NAME --provider mcp --url … --secret …``; a step says ``agent:
NAME`` with its ``tool`` and ``arguments``; the launch describes the server, the step calls the
tool through it carrying the secret as ``Authorization: Bearer``, and the run's record keeps
what it ran on (the server's name and version, the tool). The server is the mcp package's own,
on a loopback port in this process; the step runs in-process, as a worker's task body would."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from orchestration.core.errors import ValidationError
from orchestration.core.settings import Settings
from orchestration.execution import Stepper
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from tests.support.mcp_server import NAME, VERSION, MCPServer, start_mcp_server
from tests.unit.support import T0, Clock, RecordingDispatcher, cli, drive

OWNER = "acme"
TOKEN = "mcp-token-for-tests"
#: What the operator grants, in the environment's spelling (the CLI reads it from there).
GRANTS = {
    "ORCH_PROVIDER_HOSTS": "127.0.0.1",
    "ORCH_PROVIDER_SECRETS": json.dumps({"TOOLS_TOKEN": ["127.0.0.1"]}),
}


@pytest.fixture(scope="module")
def server() -> Iterator[MCPServer]:
    """A server answering tool calls synchronously, refusing requests without the token."""
    running = start_mcp_server(tasks=False, token=TOKEN)
    yield running
    running.stop()


@pytest.fixture
def granted(settings_factory: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings with the operator's grants and no raw URLs; the secret's value in this
    process's environment, where the worker reads it."""
    monkeypatch.setenv("TOOLS_TOKEN", TOKEN)
    return settings_factory(
        allow_raw_urls=False,
        provider_hosts=GRANTS["ORCH_PROVIDER_HOSTS"],
        provider_secrets=GRANTS["ORCH_PROVIDER_SECRETS"],
    )


def _flow(text: str, **options: str) -> dict[str, object]:
    step = {
        "id": "ask",
        "agent": "tools",
        "task": text,
        "with": {"tool": "echo", "arguments": {"text": "{task}"}, **options},
    }
    return {"name": "ask-tools", "steps": [step]}


def test_a_registered_mcp_agent_runs_a_step_and_the_record_says_what_it_ran_on(
    granted: Settings, server: MCPServer
) -> None:
    run = cli(granted, env=GRANTS)
    added = run(
        "agents",
        "add",
        "tools",
        "--provider",
        "mcp",
        "--url",
        server.url,
        "--secret",
        "TOOLS_TOKEN",
        "--json",
    )
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["provider"] == "mcp"

    clock = Clock(T0)
    orch = Orchestrator(granted, RecordingDispatcher(), clock=clock)
    launched = orch.launch(_flow("tides turn twice a day"), owner=OWNER)
    calls_before = server.calls["echo"]
    stepper = Stepper(granted, Executor(granted, None), clock=clock, worker="u", pid=1)
    drive(stepper, launched.id)

    record = orch.get(launched.id, owner=OWNER)
    assert record.status == "completed", (record.error, record.steps[0])
    step = record.steps[0]
    assert step.evidence is not None
    assert "tides turn twice a day" in json.dumps(step.output)
    assert server.calls["echo"] == calls_before + 1
    for moment in ("launch", "start"):
        seen = step.evidence[moment]
        assert (seen["name"], seen["version"]) == (NAME, VERSION), (moment, seen)
    assert step.evidence["start"]["detail"]["tool"] == "echo"
    # The owner sees the agent's name, never its URL or its secret.
    shown = json.dumps(record.workflow)
    assert "agent" in shown and server.url not in shown and "TOOLS_TOKEN" not in shown


def test_a_step_may_not_give_the_agents_url_nor_call_an_mcp_server_of_its_own(
    granted: Settings, server: MCPServer
) -> None:
    added = cli(granted, env=GRANTS)(
        "agents", "add", "tools", "--provider", "mcp", "--url", server.url
    )
    assert added.returncode == 0, added.stderr
    orch = Orchestrator(granted, RecordingDispatcher(), clock=Clock(T0))
    calls_before = sum(server.calls.values())
    with pytest.raises(ValidationError) as caught:
        orch.launch(_flow("x", url=server.url + "other"), owner=OWNER)
    assert caught.value.field == "steps[0].with.url"
    raw = {"id": "ask", "provider": "mcp", "task": "x", "with": {"url": server.url, "tool": "echo"}}
    with pytest.raises(ValidationError) as caught:
        orch.launch({"name": "raw", "steps": [raw]}, owner=OWNER)
    assert caught.value.field == "steps[0].provider"
    assert sum(server.calls.values()) == calls_before
