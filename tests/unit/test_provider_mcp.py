"""The mcp provider without a server: its launch checks, what an MCP answer means (event
streams, tasks, tool results), and the calls it refuses to make (egress, secrets, a passed
deadline), proved without a request.

Names resolve through an injected table, never DNS; a refused call is refused before any
connection (the resolver records what was asked, and no listener exists anywhere).
"""

from __future__ import annotations

import base64
import hashlib
import socket
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestration.core.errors import (
    LimitExceeded,
    PermanentProviderError,
    RetryableProviderError,
    ValidationError,
)
from orchestration.core.settings import Settings
from orchestration.providers import mcp, mcp_results, mcp_wire
from orchestration.providers.base import ProviderStatus, TurnRef, TurnRequest
from orchestration.providers.mcp import MCPProvider
from orchestration.providers.request_budget import RequestBudget, fill_body

URL = "https://tools.example.com/mcp"


@pytest.fixture(autouse=True)
def no_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail on any connection attempt: everything here is decided before connecting."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a connection was attempted: {args!r}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def table(asked: list[str], **names: str) -> Callable[[str], Sequence[str]]:
    """A resolver from ``names`` (dots as ``_``) that records every name asked."""

    def resolver(host: str) -> Sequence[str]:
        asked.append(host)
        address = names.get(host.replace(".", "_").replace("-", "_"))
        if address is None:
            raise OSError(f"{host}: name does not resolve")
        return [address]

    return resolver


def provider(asked: list[str], **settings: Any) -> MCPProvider:
    chosen = Settings(**{"provider_hosts": "tools.example.com:443", **settings})
    return MCPProvider(chosen, resolver=table(asked, tools_example_com="203.0.113.7"))


def request(**kw: Any) -> TurnRequest:
    return TurnRequest(
        key="r:s:1",
        run_id="r",
        step_id="s",
        attempt=1,
        input=kw.pop("input", {"text": "hi"}),
        options=kw.pop("options", {"url": URL, "tool": "echo"}),
        **kw,
    )


# --- launch checks --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field", "problem"),
    [
        ({"tool": "echo"}, "url", "is required"),
        ({"url": "ftp://tools.example.com/", "tool": "echo"}, "url", "absolute http(s) URL"),
        ({"url": URL}, "tool", "is required: the name of the tool"),
        ({"url": URL, "tool": ""}, "tool", "is required"),
        ({"url": URL, "tool": "t", "tol": 1}, "tol", "known: url, tool, arguments, headers"),
        ({"url": URL, "tool": "t", "arguments": "text"}, "arguments", "must be a mapping"),
        ({"url": URL, "tool": "t", "arguments": [1]}, "arguments", "must be a mapping"),
        ({"url": URL, "tool": "t", "headers": {"Host": "x"}}, "headers.Host", ""),
        (
            {"url": URL, "tool": "t", "headers": {"X-Key": {"secret": ""}}},
            "headers.X-Key.secret",
            "must name",
        ),
    ],
)
def test_bad_options_fail_the_launch_naming_the_field(
    options: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        provider([]).validate(options)
    assert refused.value.field == field
    assert problem in str(refused.value)


def test_arguments_are_bounded_at_launch() -> None:
    many = {f"a{n}": "{task}" for n in range(65)}
    with pytest.raises(LimitExceeded) as refused:
        provider([]).validate({"url": URL, "tool": "t", "arguments": many})
    assert refused.value.field == "arguments"
    assert "over 64 placeholders" in str(refused.value)
    five = {f"a{n}": "{task}" for n in range(5)}
    with pytest.raises(LimitExceeded, match="ORCH_MAX_REQUEST_BYTES"):
        provider([]).validate({"url": URL, "tool": "t", "arguments": five})
    nested: Any = "{task}"
    for _ in range(40):
        nested = {"a": nested}
    with pytest.raises(ValidationError, match="nested deeper"):
        provider([]).validate({"url": URL, "tool": "t", "arguments": nested})


def test_a_url_outside_the_allow_list_fails_the_launch() -> None:
    with pytest.raises(ValidationError) as refused:
        provider([], provider_hosts="127.0.0.0/8").validate({"url": URL, "tool": "t"})
    assert refused.value.field == "url"
    assert "ORCH_PROVIDER_HOSTS" in str(refused.value)


def test_a_secret_header_must_be_declared_for_the_servers_host() -> None:
    options = {
        "url": URL,
        "tool": "t",
        "headers": {"Authorization": {"secret": "TOOLS_KEY", "prefix": "Bearer "}},
    }
    with pytest.raises(ValidationError) as refused:
        provider([]).validate(options)
    assert refused.value.field == "headers.Authorization.secret"
    assert "TOOLS_KEY is not declared in ORCH_PROVIDER_SECRETS" in str(refused.value)
    provider([], provider_secrets={"TOOLS_KEY": ["tools.example.com:443"]}).validate(options)


def test_good_options_pass() -> None:
    provider([]).validate(
        {"url": URL, "tool": "search", "arguments": {"query": "{task}", "id": "{key}"}}
    )


# --- calls refused before any request --------------------------------------------------


def test_a_host_that_resolves_outside_the_allow_list_is_never_connected() -> None:
    asked: list[str] = []
    refusing = MCPProvider(
        Settings(provider_hosts="203.0.113.0/24", provider_timeout=2),
        resolver=table(asked, tools_example_com="10.20.30.40"),
    )
    with pytest.raises(PermanentProviderError, match="refused before connecting"):
        refusing.start(request())
    with pytest.raises(PermanentProviderError, match="refused before connecting"):
        refusing.cancel(TurnRef("r:s:1", '{"task":"t1","session":"s1"}', {"url": URL}))
    assert asked == ["tools.example.com", "tools.example.com"]


def test_a_start_past_its_deadline_sends_nothing() -> None:
    asked: list[str] = []
    late = request(deadline=datetime.now(UTC) - timedelta(milliseconds=5))
    with pytest.raises(RetryableProviderError, match="deadline passed"):
        provider(asked).start(late)
    assert asked == []


def test_a_task_that_is_no_object_cannot_be_the_arguments() -> None:
    asked: list[str] = []
    with pytest.raises(PermanentProviderError, match=r"with\.arguments is \"\{task\}\""):
        provider(asked).start(request(input="just text"))
    assert asked == []


def test_a_secret_not_in_the_workers_environment_is_not_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TOOLS_KEY", raising=False)
    asked: list[str] = []
    declared = provider(asked, provider_secrets={"TOOLS_KEY": ["tools.example.com:443"]})
    options = {"url": URL, "tool": "t", "headers": {"Authorization": {"secret": "TOOLS_KEY"}}}
    with pytest.raises(PermanentProviderError, match="TOOLS_KEY is not set"):
        declared.cancel(TurnRef("r:s:1", '{"task":"t1","session":"s1"}', options))
    assert asked == []


def test_turns_the_provider_cannot_address() -> None:
    asked: list[str] = []
    unknown = provider(asked)
    with pytest.raises(PermanentProviderError, match="start never answered"):
        unknown.status(TurnRef("r:s:1", None, {"url": URL, "tool": "t"}))
    unknown.cancel(TurnRef("r:s:1", None, {"url": URL, "tool": "t"}))  # nothing started
    with pytest.raises(PermanentProviderError, match="names no MCP task"):
        unknown.status(TurnRef("r:s:1", "not-a-task", {"url": URL, "tool": "t"}))
    assert asked == []


# --- the wire -----------------------------------------------------------------------------


def test_only_the_arguments_are_filled() -> None:
    params = MCPProvider._call_params({"tool": "{task}", "arguments": {"q": "{task} {key}"}}, True)
    body = fill_body(params, {"task": "x", "key": "r:s:1"}, RequestBudget(4096, "test"))
    assert bytes(body) == b'{"name":"{task}","arguments":{"q":"x r:s:1"},"task":{}}'


def test_the_response_is_found_in_an_event_stream() -> None:
    stream = (
        'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\r\n\r\n'
        'event: message\r\ndata: {"jsonrpc":"2.0","id":2,\r\ndata: "result":{"ok":true}}\r\n\r\n'
    )
    assert mcp_wire._response(stream, 2) == {"jsonrpc": "2.0", "id": 2, "result": {"ok": True}}
    assert mcp_wire._response(stream, 3) is None
    assert mcp_wire._response('{"jsonrpc":"2.0","id":1,"error":{"code":-1}}', 1) == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -1},
    }
    assert mcp_wire._response("", 1) is None
    assert mcp_wire._response("{not json", 1) is None


def test_an_event_stream_is_read_message_by_message_however_it_is_cut() -> None:
    stream = (
        b": keep-alive\r\n\r\n"
        b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\r\n\r\n'
        b'data: {"jsonrpc":"2.0","id":"task-1-1",\r\ndata: "method":"elicitation/create"}\r\r'
        b"data: not json\n\n"
        b'data: {"jsonrpc":"2.0","id":2,"result":{}}\n\n'
        b'data: {"jsonrpc":"2.0","id":3,"result":{}}\n\n'
    )
    progress = {"jsonrpc": "2.0", "method": "notifications/progress"}
    question = {"jsonrpc": "2.0", "id": "task-1-1", "method": "elicitation/create"}
    answers = [{"jsonrpc": "2.0", "id": n, "result": {}} for n in (2, 3)]
    for size in (1, 2, 7, len(stream)):  # every CRLF split across two chunks, among others
        assert _read(stream, size, stop_at="task-1-1") == [progress, question], size
        assert _read(stream, size, stop_at="no such id") == [progress, question, *answers], size


def _read(stream: bytes, size: int, stop_at: str) -> list[Any]:
    """The messages an event stream cut in ``size``-byte chunks yields, read until the one
    whose id is ``stop_at`` (as the exchange reads: no chunk after the reader said stop)."""
    seen: list[Any] = []

    def wanted(message: Any) -> bool:
        seen.append(message)
        return message.get("id") == stop_at

    events = mcp_wire._Events(wanted)
    for at in range(0, len(stream), size):
        if events.feed(stream[at : at + size]):
            break
    return seen


@pytest.mark.parametrize(
    ("answer", "schema", "content"),
    [
        ("eu", {"properties": {"answer": {"type": "string"}}}, {"answer": "eu"}),
        (3, {"properties": {"count": {"type": "number"}}}, {"count": 3}),
        ({"a": 1, "b": "x"}, {"properties": {"a": {}, "b": {}}}, {"a": 1, "b": "x"}),
        ({"branch": "left"}, {"properties": {"answer": {}}}, {"branch": "left"}),
    ],
)
def test_an_answer_is_the_content_the_question_asks_for(
    answer: Any, schema: dict[str, Any], content: dict[str, Any]
) -> None:
    wire = mcp_wire.Wire(None, URL, {}, Settings())  # type: ignore[arg-type]
    assert mcp._accepted(wire, {"requestedSchema": schema}, answer) == {
        "action": "accept",
        "content": content,
    }


def test_an_answer_that_fits_no_content_is_refused_naming_what_is_asked() -> None:
    wire = mcp_wire.Wire(None, URL, {}, Settings())  # type: ignore[arg-type]
    schema = {"properties": {"region": {}, "size": {}}}
    with pytest.raises(PermanentProviderError, match=r"2 values \(region, size\)"):
        mcp._accepted(wire, {"requestedSchema": schema}, "eu")
    with pytest.raises(PermanentProviderError, match="0 values"):
        mcp._accepted(wire, {}, "eu")


# --- what a task and a result say ------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "status"),
    [
        ("working", ProviderStatus.RUNNING),
        ("input_required", ProviderStatus.INPUT_REQUIRED),
        ("failed", ProviderStatus.FAILED),
        ("cancelled", ProviderStatus.CANCELLED),
    ],
)
def test_each_status_maps(word: str, status: ProviderStatus) -> None:
    observed = mcp_results.observed({"taskId": "t", "status": word, "statusMessage": "why"})
    assert (observed.status, observed.raw) == (status, word)


def test_what_a_task_says_goes_with_its_status() -> None:
    asking = mcp_results.observed({"status": "input_required", "statusMessage": "which?"})
    assert asking.prompt == "which?"
    failed = mcp_results.observed({"status": "failed", "statusMessage": "out of quota"})
    assert failed.error == "the tool's task failed: out of quota"
    assert mcp_results.observed({"status": "failed"}).error == "the tool's task failed"


def test_a_status_mcp_does_not_have_is_refused_naming_it() -> None:
    with pytest.raises(PermanentProviderError, match="'dreaming'"):
        mcp_results.observed({"status": "dreaming"})
    with pytest.raises(PermanentProviderError, match="'None'"):
        mcp_results.status_word({})


def test_a_result_is_its_structured_content_or_its_blocks() -> None:
    text = {"type": "text", "text": "hello"}
    assert mcp_results.output({"content": [text]}) == "hello"
    assert mcp_results.output({"content": [text], "structuredContent": {"n": 1}}) == {"n": 1}
    assert mcp_results.output({"content": []}) is None
    data = b"\x89PNG"
    image = {"type": "image", "data": base64.b64encode(data).decode(), "mimeType": "image/png"}
    link = {"type": "resource_link", "uri": "file:///a.txt", "name": "a"}
    embedded = {"type": "resource", "resource": {"uri": "mem://x", "text": "body"}}
    assert mcp_results.output({"content": [text, image, link, embedded]}) == [
        "hello",
        {
            "image": {
                "media_type": "image/png",
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": 4,
                "base64": base64.b64encode(data).decode(),
            }
        },
        {"resource_link": {"uri": "file:///a.txt", "name": "a"}},
        {"resource": {"uri": "mem://x", "text": "body"}},
    ]


def test_bad_blocks_are_refused() -> None:
    with pytest.raises(PermanentProviderError, match="not base64"):
        mcp_results.output({"content": [{"type": "audio", "data": "!!"}]})
    with pytest.raises(PermanentProviderError, match="unknown type 'video'"):
        mcp_results.output({"content": [{"type": "video"}]})
    with pytest.raises(PermanentProviderError, match="not an object"):
        mcp_results.finished(["x"], "completed")


def test_is_error_fails_with_the_tools_text() -> None:
    failed = mcp_results.finished(
        {"content": [{"type": "text", "text": "no such city"}], "isError": True}, "completed"
    )
    assert (failed.status, failed.error) == (ProviderStatus.FAILED, "the tool failed: no such city")
    silent = mcp_results.finished({"content": [], "isError": True}, "call")
    assert silent.error == "the tool failed (it said nothing)"
    done = mcp_results.finished({"content": [{"type": "text", "text": "ok"}]}, "completed")
    assert (done.status, done.output) == (ProviderStatus.COMPLETED, "ok")
