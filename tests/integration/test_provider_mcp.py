"""The mcp provider against a real MCP server: the `mcp` package's own low-level server and
streamable HTTP transport, with the tools of ``tests/support/mcp_server.py``, on a loopback
port; one server runs tool calls as tasks (MCP 2025-11-25), one does not. No mocks.

Closing-note figures (start to first status, cancel to terminal, a turn's polls) are printed
by ``test_figures``; run with ``-s`` to see them.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestration import providers
from orchestration.core.errors import (
    PermanentProviderError,
    RequestOverLimit,
    RetryableProviderError,
    ValidationError,
)
from orchestration.core.settings import Settings
from orchestration.providers.base import ProviderStatus, TurnRef, TurnRequest, TurnStatus
from orchestration.providers.mcp import MCPProvider
from tests.conftest import wait_for
from tests.support.conformance import silent
from tests.support.hostile_servers import Conversation, HostileServer
from tests.support.mcp_server import NAME, VERSION, MCPServer, start_mcp_server

pytestmark = pytest.mark.integration

#: Loopback, granted explicitly (the default list is empty).
LOOPBACK = "localhost,127.0.0.0/8,::1"
SECRET = "mcp-s3cret-token-8a2c"
TOKEN_ENV = "TEST_MCP_TOKEN"


@pytest.fixture(scope="module")
def server() -> Iterator[MCPServer]:
    running = start_mcp_server()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def plain() -> Iterator[MCPServer]:
    """A server without tasks: every call is synchronous."""
    running = start_mcp_server(tasks=False)
    yield running
    running.stop()


def settings(**kw: Any) -> Settings:
    return Settings(
        provider_timeout=kw.pop("provider_timeout", 2),
        provider_hosts=kw.pop("provider_hosts", LOOPBACK),
        provider_secrets={TOKEN_ENV: ["127.0.0.1"]},
        **kw,
    )


@pytest.fixture()
def provider() -> MCPProvider:
    """A fresh provider: a new worker process, as far as its memory goes."""
    return MCPProvider(settings())


def turn(
    server: MCPServer, tool: str = "echo", task: Any = None, *, attempt: int = 1, **kw: Any
) -> TurnRequest:
    run_id = uuid.uuid4().hex
    options = {"url": server.url, "tool": tool, **kw.pop("options", {})}
    return TurnRequest(
        key=f"{run_id}:step:{attempt}",
        run_id=run_id,
        step_id="step",
        attempt=attempt,
        input={"text": "hello"} if task is None else task,
        options=options,
        **kw,
    )


def ref(request: TurnRequest, run_id: str | None) -> TurnRef:
    return TurnRef(request.key, run_id, request.options)


def settled(provider: MCPProvider, where: TurnRef, timeout: float = 10.0) -> tuple[TurnStatus, int]:
    """The first status that is not ``running``, and how many polls it took."""
    polls = 0

    def seen() -> TurnStatus | None:
        nonlocal polls
        polls += 1
        observed = provider.status(where)
        return None if observed.status is ProviderStatus.RUNNING else observed

    return wait_for(seen, timeout, interval=0.05, what="the task settles"), polls


def test_a_task_completes_after_polls_with_its_structured_content(
    server: MCPServer, provider: MCPProvider
) -> None:
    request = turn(server, "work", {"seconds": 0.4, "text": "shipped"})
    provider.validate(request.options)
    run_id = provider.start(request)
    assert provider.status(ref(request, run_id)).raw == "working"
    observed, polls = settled(provider, ref(request, run_id))
    assert (observed.status, observed.raw, observed.output) == (
        ProviderStatus.COMPLETED,
        "completed",
        {"text": "shipped", "seconds": 0.4},
    )
    assert polls >= 2
    assert provider.snapshot(ref(request, run_id)) == {
        "status": "completed",
        "output": {"text": "shipped", "seconds": 0.4},
    }


def test_a_tool_that_answers_at_once_completes_with_its_text(
    server: MCPServer, provider: MCPProvider
) -> None:
    request = turn(server, "echo", options={"arguments": {"text": "run {key}: {task}"}})
    request = TurnRequest(**{**request.__dict__, "input": "hi"})
    observed, _ = settled(provider, ref(request, provider.start(request)))
    assert (observed.status, observed.output) == (
        ProviderStatus.COMPLETED,
        f"run {request.key}: hi",
    )
    assert server.made["echo"] >= 1, "a server with tasks runs the call as a task"


def test_a_task_cancelled_mid_way(server: MCPServer, provider: MCPProvider) -> None:
    request = turn(server, "work", {"seconds": 600})
    run_id = provider.start(request)
    assert provider.status(ref(request, run_id)).status is ProviderStatus.RUNNING
    provider.cancel(ref(request, run_id))
    observed = provider.status(ref(request, run_id))
    assert (observed.status, observed.raw) == (ProviderStatus.CANCELLED, "cancelled")
    provider.cancel(ref(request, run_id))  # cancelling a cancelled task is not an error

    done = turn(server, "echo")
    done_id = provider.start(done)
    settled(provider, ref(done, done_id))
    provider.cancel(ref(done, done_id))  # nor is cancelling a completed one
    assert provider.status(ref(done, done_id)).status is ProviderStatus.COMPLETED


def test_a_tool_error_fails_the_turn_with_the_tools_words(
    server: MCPServer, plain: MCPServer, provider: MCPProvider
) -> None:
    for running in (server, plain):
        request = turn(running, "fail", {"message": "quota spent"})
        observed, _ = settled(provider, ref(request, provider.start(request)))
        assert (observed.status, observed.error) == (
            ProviderStatus.FAILED,
            "the tool failed: quota spent",
        )


def answering(request: TurnRequest, asked: str, answer: Any) -> TurnRequest:
    """The step's next attempt, resuming with ``answer`` the turn whose run id is ``asked``
    (as the engine builds it)."""
    return TurnRequest(
        key=f"{request.run_id}:step:{request.attempt + 1}",
        run_id=request.run_id,
        step_id=request.step_id,
        attempt=request.attempt + 1,
        input=request.input,
        options=request.options,
        resume=answer,
        resuming=True,
        asked=asked,
    )


def answers_to(server: MCPServer, task_id: str) -> list[dict[str, Any]]:
    """What the client answered to the server's questions about task ``task_id``."""
    return [r for r in server.replies if str(r.get("id", "")).startswith(f"task-{task_id}-")]


def test_a_task_that_asks_is_answered_from_another_process_and_completes(
    server: MCPServer, provider: MCPProvider
) -> None:
    request = turn(server, "ask", {"question": "which region?"})
    run_id = provider.start(request)
    task_id = json.loads(run_id)["task"]
    observed, _ = settled(provider, ref(request, run_id))
    assert (observed.status, observed.prompt) == (ProviderStatus.INPUT_REQUIRED, "which region?")
    # Polling a waiting task leaves its question where the answer will find it.
    assert provider.status(ref(request, run_id)).prompt == "which region?"
    answer = answering(request, run_id, "eu-west")
    resumed = MCPProvider(settings())  # another worker process: it knows only the request
    assert resumed.start(answer) == run_id
    assert [r["result"] for r in answers_to(server, task_id)] == [
        {"action": "accept", "content": {"answer": "eu-west"}}
    ]
    observed, _ = settled(resumed, ref(answer, run_id))
    assert (observed.status, observed.output) == (ProviderStatus.COMPLETED, "eu-west")


def test_an_answer_given_twice_answers_once(server: MCPServer, provider: MCPProvider) -> None:
    request = turn(server, "ask", {"question": "which branch?"})
    run_id = provider.start(request)
    task_id = json.loads(run_id)["task"]
    settled(provider, ref(request, run_id))
    answer = answering(request, run_id, {"branch": "left"})
    assert MCPProvider(settings()).start(answer) == run_id
    # Redelivered to a worker that never saw it: the task no longer waits, nothing is sent.
    assert MCPProvider(settings()).start(answer) == run_id
    assert [r["result"] for r in answers_to(server, task_id)] == [
        {"action": "accept", "content": {"branch": "left"}}
    ]
    observed, _ = settled(provider, ref(answer, run_id))
    assert (observed.status, observed.output) == (ProviderStatus.COMPLETED, {"branch": "left"})
    assert MCPProvider(settings()).start(answer) == run_id  # and once it has completed
    assert len(answers_to(server, task_id)) == 1


def test_an_answer_to_a_task_that_no_longer_waits_is_refused(
    server: MCPServer, provider: MCPProvider
) -> None:
    request = turn(server, "ask", {"question": "which region?"})
    run_id = provider.start(request)
    settled(provider, ref(request, run_id))
    provider.cancel(ref(request, run_id))
    answer = answering(request, run_id, "eu-west")
    with pytest.raises(PermanentProviderError, match=r"no longer waiting.*cancelled"):
        MCPProvider(settings()).start(answer)
    gone = json.dumps({"task": "no-such-task", "session": "no-such-session"})
    with pytest.raises(PermanentProviderError, match="no longer waiting"):
        MCPProvider(settings()).start(answering(request, gone, "eu-west"))
    with pytest.raises(PermanentProviderError, match="names no MCP task"):
        MCPProvider(settings()).start(answering(request, None, "eu-west"))
    assert answers_to(server, json.loads(run_id)["task"]) == []


def test_a_synchronous_call_that_asks_is_declined_at_once(
    plain: MCPServer, provider: MCPProvider
) -> None:
    request = turn(plain, "ask", {"question": "which region?"})
    began = time.monotonic()
    observed = provider.status(ref(request, provider.start(request)))
    assert time.monotonic() - began < 1.5, "the question is declined, not left to the deadline"
    assert (observed.status, observed.error) == (
        ProviderStatus.FAILED,
        "the tool failed: the question was not answered (decline)",
    )
    assert plain.replies[-1]["result"] == {"action": "decline"}


def test_a_redelivered_start_makes_one_task(server: MCPServer) -> None:
    provider = MCPProvider(settings())
    request = turn(server, "work", {"seconds": 600, "text": "once"})
    before = server.made["work"]
    first = provider.start(request)
    assert server.keys[-1] == request.key, "the turn key goes as Idempotency-Key"
    assert provider.start(request) == first
    assert provider.status(ref(request, None)).status is ProviderStatus.RUNNING
    assert server.made["work"] == before + 1
    # The next attempt is a new turn: a task of its own.
    retry = turn(server, "work", {"seconds": 600}, attempt=2)
    other = provider.start(retry)
    assert other != first
    assert server.made["work"] == before + 2
    provider.cancel(ref(request, first))
    provider.cancel(ref(retry, other))


def test_a_start_whose_answer_is_lost_finds_its_task_in_its_session(
    server: MCPServer, provider: MCPProvider
) -> None:
    request = turn(server, "work", {"seconds": 600})
    before = server.made["work"]
    server.lose_answers = 1
    try:
        run_id = provider.start(request)
    finally:
        server.lose_answers = 0
    assert server.made["work"] == before + 1
    assert provider.status(ref(request, run_id)).raw == "working"
    provider.cancel(ref(request, run_id))
    assert provider.status(ref(request, run_id)).status is ProviderStatus.CANCELLED


def test_a_synchronous_call_answers_in_the_status_after_its_start(
    plain: MCPServer, provider: MCPProvider
) -> None:
    request = turn(plain, "work", {"seconds": 0.1, "text": "sync"})
    run_id = provider.start(request)
    assert plain.made["work"] == 0
    observed = provider.status(ref(request, run_id))
    assert (observed.status, observed.output) == (
        ProviderStatus.COMPLETED,
        {"text": "sync", "seconds": 0.1},
    )
    assert provider.start(request) == run_id, "a redelivered start calls no second time"
    assert plain.calls["work"] == 1
    provider.cancel(ref(request, run_id))  # a bounded call: nothing to cancel
    elsewhere = MCPProvider(settings())  # another worker process
    with pytest.raises(PermanentProviderError, match="answer is gone with the worker"):
        elsewhere.status(ref(request, run_id))
    assert provider.snapshot(ref(request, run_id))["output"] == {"text": "sync", "seconds": 0.1}
    assert elsewhere.snapshot(ref(request, run_id)) == {"status": "call", "output": None}


def test_a_tool_slower_than_the_deadline_fails_naming_the_setting(
    plain: MCPServer, provider: MCPProvider
) -> None:
    request = turn(plain, "work", {"seconds": 30})
    began = time.monotonic()
    run_id = provider.start(request)
    took = time.monotonic() - began
    observed = provider.status(ref(request, run_id))
    assert observed.status is ProviderStatus.FAILED
    assert "did not answer within 2s" in (observed.error or "")
    assert "ORCH_PROVIDER_TIMEOUT" in (observed.error or "")
    assert took < 2 + 1.0, "the call ends by its deadline"


def test_a_start_past_its_deadline_begins_no_call(server: MCPServer, provider: MCPProvider) -> None:
    late = turn(server, "work", deadline=datetime.now(UTC) - timedelta(seconds=1))
    before = server.calls["work"]
    with pytest.raises(RetryableProviderError, match="deadline passed"):
        provider.start(late)
    assert server.calls["work"] == before


def test_status_and_cancel_of_a_task_whose_server_hangs_end_at_the_deadline(
    server: MCPServer,
) -> None:
    """A task's server that stops answering mid-task (the conformance suite sends its status
    and cancel a stand-in run id, which names no MCP task): each call ends by its deadline,
    as an outage. The bound is generous, the machine may be loaded: the point is the end."""
    provider = MCPProvider(settings(provider_timeout=1))
    request = turn(server, "work", {"seconds": 600})
    run_id = provider.start(request)
    with HostileServer(silent) as hanging:
        where = TurnRef(request.key, run_id, {**request.options, "url": hanging.url})
        for call in (provider.status, provider.cancel):
            began = time.monotonic()
            with pytest.raises(RetryableProviderError):
                call(where)
            assert time.monotonic() - began < 1 + 6.0, call
        assert len(hanging.requests) == 2, "each call reached the hanging server"
    provider.cancel(ref(request, run_id))


def question_taken(talk: Conversation) -> None:
    """An MCP server whose task waits for input but whose question another reader took (a
    worker that died after ``tasks/result`` gave it the question): ``tasks/get`` says
    ``input_required``; ``tasks/result`` streams notifications, never the question."""
    sent = json.loads(talk.request.body)
    if sent["method"] == "tasks/get":
        task = {"taskId": "t1", "status": "input_required", "statusMessage": "which region?"}
        body = json.dumps({"jsonrpc": "2.0", "id": sent["id"], "result": task}).encode()
        head = "Content-Type: application/json\r\nConnection: close\r\nContent-Length: "
        talk.send(f"HTTP/1.1 200 OK\r\n{head}{len(body)}\r\n\r\n".encode() + body)
        return
    talk.send(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    event = b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{}}\n\n'
    while True:
        talk.send(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        talk.pause(0.05)


def test_an_answer_whose_question_never_comes_ends_at_the_deadline(server: MCPServer) -> None:
    provider = MCPProvider(settings(provider_timeout=1))
    with HostileServer(question_taken) as hanging:
        request = turn(server, "ask", options={"url": hanging.url})
        asked = json.dumps({"task": "t1", "session": "s1"})
        began = time.monotonic()
        with pytest.raises(RetryableProviderError, match="no answer within"):
            provider.start(answering(request, asked, "eu-west"))
        assert time.monotonic() - began < 1 + 6.0
        assert [json.loads(r.body)["method"] for r in hanging.requests] == [
            "tasks/get",
            "tasks/result",
        ]


def test_the_server_and_the_tool_are_the_evidence(
    server: MCPServer, plain: MCPServer, provider: MCPProvider
) -> None:
    evidence = provider.describe({"url": server.url, "tool": "work"})
    assert (evidence.name, evidence.version, dict(evidence.detail)) == (
        NAME,
        VERSION,
        {"tool": "work", "task_support": "optional"},
    )
    assert dict(provider.describe({"url": plain.url, "tool": "work"}).detail) == {
        "tool": "work",
        "task_support": "forbidden",
    }
    with pytest.raises(PermanentProviderError, match="no tool 'translate'"):
        provider.describe({"url": server.url, "tool": "translate"})


def test_egress_is_refused_before_any_request(server: MCPServer) -> None:
    closed = MCPProvider(settings(provider_hosts="example.org"))
    request = turn(server, "echo")
    with pytest.raises(ValidationError, match="ORCH_PROVIDER_HOSTS"):
        closed.validate(request.options)
    before = sum(server.calls.values())
    with pytest.raises(PermanentProviderError, match="refused before connecting"):
        closed.start(request)
    with pytest.raises(PermanentProviderError, match="refused before connecting"):
        closed.describe(request.options)
    assert sum(server.calls.values()) == before


def test_a_secret_header_is_sent_bound_and_never_shown(
    server: MCPServer, provider: MCPProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    headers = {"Authorization": {"secret": TOKEN_ENV, "prefix": "Bearer "}}
    request = turn(server, "echo", options={"headers": headers})
    provider.validate(request.options)
    server.token = SECRET
    try:
        observed, _ = settled(provider, ref(request, provider.start(request)))
        assert observed.output == "hello"
        server.token = "another-token"  # the server now echoes what it got in its 401
        with pytest.raises(PermanentProviderError) as refused:
            provider.start(turn(server, "echo", options={"headers": headers}))
    finally:
        server.token = None
    assert "answered 401" in str(refused.value)
    assert SECRET not in str(refused.value)

    unbound = MCPProvider(
        Settings(provider_hosts=LOOPBACK, provider_secrets={TOKEN_ENV: ["x.org"]})
    )
    with pytest.raises(ValidationError, match=r"headers\.Authorization\.secret"):
        unbound.validate(request.options)


def test_the_request_budget_holds_for_the_arguments(server: MCPServer) -> None:
    bounded = settings()
    provider = MCPProvider(bounded)
    request = turn(server, "echo", {"text": "x" * bounded.max_request_bytes})
    before = server.calls["echo"]
    with pytest.raises(RequestOverLimit, match="ORCH_MAX_REQUEST_BYTES"):
        provider.start(request)
    assert server.calls["echo"] == before


def test_a_json_answering_server_and_a_server_that_is_down() -> None:
    provider = MCPProvider(settings())
    answering = start_mcp_server(json_response=True)
    try:
        request = turn(answering, "work", {"seconds": 0.1, "text": "json"})
        observed, _ = settled(provider, ref(request, provider.start(request)))
        assert observed.output == {"text": "json", "seconds": 0.1}
    finally:
        answering.stop()
    with pytest.raises(RetryableProviderError, match="cannot reach"):
        provider.start(turn(answering, "echo"))


def test_the_registry_serves_it(server: MCPServer) -> None:
    assert "mcp" in providers.names()
    provider = providers.get_provider("mcp", settings())
    request = turn(server, "echo")
    assert provider.status(ref(request, provider.start(request))).status in (
        ProviderStatus.RUNNING,
        ProviderStatus.COMPLETED,
    )


def test_figures(server: MCPServer) -> None:
    """Medians over a few turns: start to first status, cancel to terminal, a turn's polls
    (polled every 50 ms; the tool works 0.2 s)."""
    provider = MCPProvider(settings())
    first, cancels, polls = [], [], []
    for _ in range(15):
        request = turn(server, "work", {"seconds": 0.2})
        began = time.perf_counter()
        run_id = provider.start(request)
        provider.status(ref(request, run_id))
        first.append(time.perf_counter() - began)
        _observed, count = settled(provider, ref(request, run_id))
        polls.append(count + 1)

        working = turn(server, "work", {"seconds": 600})
        working_id = provider.start(working)
        began = time.perf_counter()
        provider.cancel(ref(working, working_id))
        assert provider.status(ref(working, working_id)).status is ProviderStatus.CANCELLED
        cancels.append(time.perf_counter() - began)
    print(
        f"\nmcp figures (median of 15): start to first status "
        f"{statistics.median(first) * 1000:.1f} ms; cancel to terminal "
        f"{statistics.median(cancels) * 1000:.1f} ms; polls per turn {statistics.median(polls)}"
    )
