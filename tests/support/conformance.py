"""How to make each provider's real server do what the provider conformance suite asks
(``tests/integration/test_provider_conformance.py``): one :class:`Adapter` per provider in
:data:`ADAPTERS`. Another provider joins the suite with one entry.

An adapter starts the provider's test server (the scripted store, the agent service of
``agent_service.py``, a ``langgraph dev`` server, the a2a-sdk's server of ``a2a_agent.py``),
says how to make a turn complete, work for long, fail or ask a human, how many turns the
server began for a key, how to resume an asking turn, how to aim a turn at any URL with a
secret header (for egress and secrets), and which call meets a server that hangs. A capability
a protocol has not is ``None`` beside the reason, which the suite skips with.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from orchestration.core.settings import Settings
from orchestration.providers.a2a import A2AProvider, context_id
from orchestration.providers.base import Provider, TurnRequest
from orchestration.providers.http import HttpProvider
from orchestration.providers.langgraph import KEY_FIELD, LangGraphProvider, thread_id
from orchestration.providers.mcp import MCPProvider
from orchestration.providers.scripted import ScriptedProvider
from tests.support.a2a_agent import A2AAgent
from tests.support.agent_service import AgentService
from tests.support.hostile_servers import Conversation
from tests.support.langgraph_server import LangGraphServer, available
from tests.support.mcp_server import MCPServer, start_mcp_server

#: Loopback, granted explicitly (the default list is empty).
LOOPBACK = "localhost,127.0.0.0/8,::1"
#: The environment variable holding the suite's secret (bound per test in the settings).
SECRET_ENV = "CONFORMANCE_TOKEN"
#: What an asking turn asks, and the human's answer that resumes it.
ANSWER = {"branch": "left"}


@dataclass(frozen=True)
class Play:
    """A turn that makes the server do one thing: its input, its ``with:`` options, and what
    the provider should then report (an output, an error's text, a prompt)."""

    input: Any
    options: dict[str, Any]
    output: Any = None
    error: str | None = None
    prompt: Any = None
    #: Called just before the start, for a server whose script is set service-wide.
    arrange: Callable[[], None] = field(default=lambda: None)


@dataclass(frozen=True)
class Adapter:
    """How one provider's server is made to do what each case needs."""

    name: str
    provider: Callable[[Settings], Provider]
    #: The server, started; stopped when the context ends.
    serve: Callable[[Path], contextlib.AbstractContextManager[Any]]
    #: Settings the provider needs for this server (e.g. the scripted store's URL).
    settings: Callable[[Any], dict[str, Any]]
    completes: Callable[[Any], Play]
    works: Callable[[Any], Play]
    fails: Callable[[Any], Play]
    #: How many turns the server began for the request's key.
    turns: Callable[[Any, TurnRequest], int]
    #: An asking turn, and the output once resumed with :data:`ANSWER`; ``None`` when the
    #: protocol has no human input (then ``no_resume`` says why).
    asks: Callable[[Any], tuple[Play, Play]] | None = None
    no_resume: str = ""
    #: Options that send a turn to ``url``, with the suite's secret as a header when asked;
    #: ``None`` for a provider that makes no outbound call (``no_url`` says why).
    aim: Callable[[str, bool], dict[str, Any]] | None = None
    no_url: str = ""
    #: A turn whose ``status`` call blocks past the provider's deadline, for a provider with
    #: no URL to aim at a hanging server.
    hangs: Callable[[Any], Play] | None = None
    #: The provider run id of a turn on the hanging server that status and cancel are
    #: pointed at: one of the provider's own shape (a provider may refuse any other unsent).
    stand_in: str = "turn-1"
    #: Cases this provider is known to fail, by test name, with the divergence: run as strict
    #: expected failures, so a fix shows (and the entry goes).
    gaps: dict[str, str] = field(default_factory=dict)


def request(play: Play, *, run: str | None = None, attempt: int = 1, **extra: Any) -> TurnRequest:
    """A turn of ``play`` with a fresh key (``run:step:attempt``)."""
    run_id = run or uuid.uuid4().hex
    return TurnRequest(
        key=f"{run_id}:step:{attempt}",
        run_id=run_id,
        step_id="step",
        attempt=attempt,
        input=play.input,
        options=play.options,
        **extra,
    )


def silent(talk: Conversation) -> None:
    """A hostile server's behaviour: read the request, then answer nothing, ever (until the
    server stops)."""
    talk.pause(600)


# --- scripted: the simulator's store is its server ------------------------------------------


@contextlib.contextmanager
def _scripted_store(folder: Path) -> Iterator[str]:
    yield f"sqlite:///{folder / 'scripted.db'}"


def _scripted(states: list[list[Any]], **options: Any) -> dict[str, Any]:
    return {"states": states, **options}


SCRIPTED = Adapter(
    name="scripted",
    provider=ScriptedProvider,
    serve=_scripted_store,
    settings=lambda url: {"scripted_url": url},
    completes=lambda _: Play(
        "hello", _scripted([["running", 0.2], ["completed"]], output="done"), output="done"
    ),
    works=lambda _: Play("hello", _scripted([["running", 600], ["completed"]])),
    fails=lambda _: Play(
        "hello", _scripted([["running", 0.1], ["failed"]], error="boom"), error="boom"
    ),
    turns=lambda url, req: len(
        [
            turn
            for turn in ScriptedProvider(Settings(scripted_url=url)).turns(req.run_id + ":")
            if turn["key"] == req.key
        ]
    ),
    asks=lambda _: (
        Play(
            "hello", _scripted([["input_required"]], prompt="which branch?"), prompt="which branch?"
        ),
        Play("hello", _scripted([["input_required"]], prompt="which branch?"), output=ANSWER),
    ),
    no_url="the scripted provider makes no outbound call: no URL to refuse, no secret to send",
    hangs=lambda _: Play("hello", _scripted([["running"]], poll_delay=60)),
)


# --- http: the templated spec against the small agent service ------------------------------

_STATUS_MAP = {
    "queued": "pending",
    "working": "running",
    "done": "completed",
    "failed": "failed",
    "waiting": "input_required",
    "stopped": "cancelled",
}


def _http_options(url: str, secret: bool = False) -> dict[str, Any]:
    options: dict[str, Any] = {
        "start": {"url": f"{url}/runs", "body": {"task": "{task}"}},
        "resume": {"url": f"{url}/runs", "body": {"task": "{resume}"}},
        "status": {"url": f"{url}/runs/{{run_id}}"},
        "cancel": {"url": f"{url}/runs/{{run_id}}/cancel"},
        "run_id_path": "data.id",
        "status_path": "state",
        "output_path": "result",
        "error_path": "failure.message",
        "prompt_path": "question",
        "status_map": _STATUS_MAP,
    }
    if secret:
        options["headers"] = {"Authorization": {"env": SECRET_ENV, "prefix": "Bearer "}}
    return options


@contextlib.contextmanager
def _agent_service(_: Path) -> Iterator[AgentService]:
    service = AgentService().start()
    try:
        yield service
    finally:
        service.stop()


def _scripting(service: AgentService, script: list[tuple[str, float]]) -> Callable[[], None]:
    def arrange() -> None:
        service.script = script

    return arrange


HTTP = Adapter(
    name="http",
    provider=HttpProvider,
    serve=_agent_service,
    settings=lambda _: {},
    completes=lambda s: Play(
        "hello",
        _http_options(s.url),
        output={"echo": "hello"},
        arrange=_scripting(s, [("working", 0.2), ("done", 0)]),
    ),
    works=lambda s: Play(
        "hello", _http_options(s.url), arrange=_scripting(s, [("working", 600), ("done", 0)])
    ),
    fails=lambda s: Play(
        "hello",
        _http_options(s.url),
        error="the agent gave up",
        arrange=_scripting(s, [("working", 0.1), ("failed", 0)]),
    ),
    turns=lambda s, req: len([t for t in s.turns.values() if t.key == req.key]),
    # The spec's protocol for a human's answer is a ``resume`` request that starts the next
    # turn with ``{resume}`` in its body; this service echoes it.
    asks=lambda s: (
        Play(
            "hello",
            _http_options(s.url),
            prompt="which branch?",
            arrange=_scripting(s, [("waiting", 0)]),
        ),
        Play(
            "hello",
            _http_options(s.url),
            output={"echo": ANSWER},
            arrange=_scripting(s, [("done", 0)]),
        ),
    ),
    aim=_http_options,
)


# --- langgraph: a langgraph dev server on tests/langgraph_app --------------------------------


@contextlib.contextmanager
def _langgraph_server(folder: Path) -> Iterator[LangGraphServer]:
    server = LangGraphServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _graph(url: str, graph: str, delay: float | None = None) -> dict[str, Any]:
    options: dict[str, Any] = {"url": url, "assistant_id": graph}
    if delay is not None:
        options["config"] = {"configurable": {"delay": delay}}
    return options


def _langgraph_runs(server: LangGraphServer, req: TurnRequest) -> int:
    reply = httpx.get(f"{server.url}/threads/{thread_id(req.key)}/runs", timeout=5)
    if reply.status_code == 404:
        return 0
    return len([run for run in reply.json() if run["metadata"].get(KEY_FIELD) == req.key])


LANGGRAPH = Adapter(
    name="langgraph",
    provider=LangGraphProvider,
    serve=_langgraph_server,
    settings=lambda _: {},
    completes=lambda s: Play(
        "ship it", _graph(s.url, "answer", 0.2), output={"answer": 42, "task": "ship it"}
    ),
    works=lambda s: Play("hello", _graph(s.url, "answer", 60)),
    fails=lambda s: Play(
        "boom", _graph(s.url, "fail"), error="ValueError: deliberate failure for boom"
    ),
    turns=_langgraph_runs,
    asks=lambda s: (
        Play("deploy", _graph(s.url, "ask"), prompt={"question": "approve deploy?"}),
        Play("deploy", _graph(s.url, "ask"), output=f"human said: {ANSWER}"),
    ),
    aim=lambda url, secret: {
        **_graph(url, "answer"),
        **({"api_key_env": SECRET_ENV} if secret else {}),
    },
)


# --- a2a: the a2a-sdk's own server around a small executor -----------------------------------


@contextlib.contextmanager
def _a2a_agent(_: Path) -> Iterator[A2AAgent]:
    agent = A2AAgent().start()
    try:
        yield agent
    finally:
        agent.stop()


def _a2a_options(url: str, secret: bool = False) -> dict[str, Any]:
    options: dict[str, Any] = {"url": url}
    if secret:
        options["headers"] = {"Authorization": {"secret": SECRET_ENV, "prefix": "Bearer "}}
    return options


A2A = Adapter(
    name="a2a",
    provider=A2AProvider,
    serve=_a2a_agent,
    settings=lambda _: {},
    completes=lambda s: Play("hello", _a2a_options(s.url), output="hello"),
    works=lambda s: Play({"do": "work"}, _a2a_options(s.url)),
    fails=lambda s: Play(
        {"do": "fail", "reason": "the model was overloaded"},
        _a2a_options(s.url),
        error="the agent failed the task: ",
    ),
    turns=lambda s, req: len(s.tasks_in(context_id(req.key))),
    asks=lambda s: (
        Play(
            {"do": "ask", "question": "which branch?"}, _a2a_options(s.url), prompt="which branch?"
        ),
        Play({"do": "ask"}, _a2a_options(s.url), output={"answer": ANSWER}),
    ),
    aim=_a2a_options,
)


# --- mcp: the mcp package's own server around our tools (tests/support/mcp_server.py) --------


def _mcp_serving(tasks: bool) -> Callable[[Path], contextlib.AbstractContextManager[MCPServer]]:
    """The test server, with task support (MCP 2025-11-25) or without (synchronous calls)."""

    @contextlib.contextmanager
    def serve(_: Path) -> Iterator[MCPServer]:
        server = start_mcp_server(tasks=tasks)
        try:
            yield server
        finally:
            server.stop()

    return serve


def _mcp_options(url: str, tool: str = "echo", secret: bool = False) -> dict[str, Any]:
    options: dict[str, Any] = {"url": url, "tool": tool}
    if secret:
        options["headers"] = {"Authorization": {"secret": SECRET_ENV, "prefix": "Bearer "}}
    return options


def _mcp_turns(server: MCPServer, req: TurnRequest) -> int:
    """The ``tools/call`` requests the server received with the turn key (its
    ``Idempotency-Key``): MCP gives a task no name of the requestor's to count by."""
    return server.keys.count(req.key)


MCP = Adapter(
    name="mcp",
    provider=MCPProvider,
    serve=_mcp_serving(tasks=True),
    settings=lambda _: {},
    completes=lambda s: Play(
        {"seconds": 0.2, "text": "done"},
        _mcp_options(s.url, "work"),
        output={"text": "done", "seconds": 0.2},
    ),
    works=lambda s: Play({"seconds": 600}, _mcp_options(s.url, "work")),
    fails=lambda s: Play(
        {"message": "boom"}, _mcp_options(s.url, "fail"), error="the tool failed: boom"
    ),
    turns=_mcp_turns,
    asks=lambda s: (
        Play({"question": "which branch?"}, _mcp_options(s.url, "ask"), prompt="which branch?"),
        Play({"question": "which branch?"}, _mcp_options(s.url, "ask"), output=ANSWER),
    ),
    # The suite's turns aimed at a URL carry the text "hello": the echo tool's text.
    aim=lambda url, secret: {**_mcp_options(url, "echo", secret), "arguments": {"text": "{task}"}},
    # A task and its session, as mcp's run ids are: status and cancel then reach the server.
    stand_in=json.dumps({"task": "task-1", "session": None}, separators=(",", ":")),
)


#: A server without tasks answers every call within the start: no turn of it is ever running.
_NO_RUNNING = (
    "a server without tasks answers the call within the start (at most ORCH_PROVIDER_TIMEOUT): "
    "no turn is ever observed running, and one that works longer fails at its start, naming "
    "the setting, so there is nothing live to cancel"
)

MCP_SYNC = Adapter(
    name="mcp-sync",
    provider=MCPProvider,
    serve=_mcp_serving(tasks=False),
    settings=lambda _: {},
    completes=MCP.completes,
    works=MCP.works,
    fails=MCP.fails,
    turns=_mcp_turns,
    # Without tasks the ask tool asks within the call, and the provider declines: nothing parks.
    asks=MCP.asks,
    aim=MCP.aim,
    stand_in=MCP.stand_in,
    gaps={
        "test_status_maps_running_completed_with_output_and_failed": _NO_RUNNING,
        "test_cancel_is_bounded_and_idempotent_on_a_live_and_a_finished_turn": _NO_RUNNING,
        "test_figures": _NO_RUNNING,
        "test_input_required_then_resume": (
            "a server without tasks has no input_required: a tool that needs input asks within "
            "the call, which the provider declines (no person is there to answer it), so the "
            "call ends (the test server's ask tool with an error) and nothing resumes"
        ),
    },
)


#: Every provider the suite runs, by name. A new provider adds its entry here.
ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter for adapter in (SCRIPTED, HTTP, LANGGRAPH, A2A, MCP, MCP_SYNC)
}


def unavailable(adapter: Adapter) -> str | None:
    """Why this provider's server cannot run here, or ``None`` when it can."""
    if adapter is LANGGRAPH and not available():
        return "langgraph-cli[inmem] is not installed (pip install 'langgraph-cli[inmem]')"
    return None
