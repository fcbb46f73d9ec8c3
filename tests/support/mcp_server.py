"""A real MCP server for the mcp provider's tests and docs: the `mcp` package's own low-level
server and streamable HTTP transport around a few tools of ours, served by uvicorn on a
loopback port in a thread.

With ``tasks=True`` (the default) the server enables the package's task support (MCP
2025-11-25: task-augmented ``tools/call``, ``tasks/get``, ``tasks/result``, ``tasks/list``,
``tasks/cancel``), and every tool takes task augmentation (``execution.taskSupport:
optional``). With ``tasks=False`` it has none: every call is answered synchronously.

Tools:

* ``echo {text}``: answers the text at once;
* ``work {seconds, text}``: works ``seconds`` (default 0.5), then answers the text, and
  ``{"text", "seconds"}`` as structured content;
* ``fail {message}``: answers ``isError`` with the message;
* ``ask {question}``: asks the client the question the spec's way, by form elicitation
  (``{answer: string}``), and answers with the answer: the text of ``answer``, or the whole
  content (structured) when it holds other fields; a declined question answers an error. As
  a task it says the question first (``statusMessage``) and waits ``input_required`` until
  the client answers through ``tasks/result``, or the task is cancelled. Outside a task, to
  a client that does not declare elicitation, it answers its question at once.

Knobs: ``token`` makes every request carry ``Authorization: Bearer TOKEN`` (a wrong one is
refused with a 401 that echoes it, as careless services do); ``json_response`` answers JSON
instead of an event stream; ``lose_answers`` replaces that many of the next ``tools/call``
answers with a 502, after the server acted on the call (an answer lost on the way back).
``calls`` counts the ``tools/call`` requests each tool received, ``made`` the tasks the server
made for each, ``keys`` the ``Idempotency-Key`` header of each ``tools/call``, ``replies`` the
JSON-RPC responses the client sent to the server's own requests (its answers to questions).

Start one from a test with :func:`start_mcp_server` (returns the running server, ``url`` set)
or :func:`mcp_server_url` (a context manager yielding its URL),
or alone (the docs do) with ``python -m tests.support.mcp_server --port PORT [--no-tasks]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import threading
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn
from mcp import types
from mcp.server.experimental.task_context import ServerTaskContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

NAME = "orchestration-test-tools"
VERSION = "1.4.0"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _schema(**properties: str) -> dict[str, Any]:
    return {"type": "object", "properties": {name: {"type": t} for name, t in properties.items()}}


def _tools(tasks: bool) -> list[types.Tool]:
    execution = types.ToolExecution(taskSupport="optional") if tasks else None
    described = {
        "echo": ("Answers the text at once.", _schema(text="string")),
        "work": ("Works a while, then answers the text.", _schema(seconds="number", text="string")),
        "fail": ("Answers an error with the message.", _schema(message="string")),
        "ask": ("Asks the question, then answers the answer.", _schema(question="string")),
    }
    return [
        types.Tool(name=name, description=text, inputSchema=schema, execution=execution)
        for name, (text, schema) in described.items()
    ]


def _text(text: str) -> list[types.TextContent]:
    return [types.TextContent(type="text", text=text)]


#: What the ``ask`` tool asks for.
_ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
}


def _answered(result: types.ElicitResult) -> types.CallToolResult:
    """The ``ask`` tool's answer: the answer's text, or the content when it holds more."""
    content = result.content or {}
    if result.action != "accept":
        return types.CallToolResult(
            content=_text(f"the question was not answered ({result.action})"), isError=True
        )
    if set(content) == {"answer"}:
        return types.CallToolResult(content=_text(str(content["answer"])))
    return types.CallToolResult(content=_text(json.dumps(content)), structuredContent=content)


async def _run(name: str, args: dict[str, Any]) -> types.CallToolResult:
    """What a tool answers (the ``ask`` tool outside a task answers its question)."""
    if name == "work":
        seconds = float(args.get("seconds", 0.5))
        await anyio.sleep(seconds)
        text = str(args.get("text", "done"))
        return types.CallToolResult(
            content=_text(text), structuredContent={"text": text, "seconds": seconds}
        )
    if name == "fail":
        return types.CallToolResult(
            content=_text(str(args.get("message", "it broke"))), isError=True
        )
    return types.CallToolResult(content=_text(str(args.get("text", args.get("question", "")))))


def build(tasks: bool, calls: Counter[str], made: Counter[str]) -> Server[Any, Any]:
    """The low-level server with our tools (and the package's task support when ``tasks``),
    counting the calls and the tasks made per tool."""
    server: Server[Any, Any] = Server(NAME, version=VERSION)
    store = None
    if tasks:
        # mcp 1.30 marks the API deprecated (MCP 2026-07-28 moves tasks to an extension);
        # it is the package's implementation of MCP 2025-11-25 tasks, which the provider speaks.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            store = server.experimental.enable_tasks().store

    @server.list_tools()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        return _tools(tasks)

    @server.call_tool(validate_input=True)  # type: ignore[untyped-decorator]
    async def call_tool(name: str, args: dict[str, Any]) -> Any:
        calls[name] += 1
        ctx = server.request_context
        question = str(args.get("question", "?"))
        if store is None or not ctx.experimental.is_task:
            asks = ctx.session.check_client_capability(
                types.ClientCapabilities(elicitation=types.ElicitationCapability())
            )
            if name == "ask" and asks:
                return _answered(
                    await ctx.session.elicit_form(question, _ANSWER_SCHEMA, ctx.request_id)
                )
            return await _run(name, args)
        made[name] += 1

        async def work(task: ServerTaskContext) -> types.CallToolResult:
            if name == "ask":
                # The question first as the task's status message (what a poller sees), then
                # the elicitation, which tasks/result delivers to the client.
                await task.update_status(question)
                return _answered(await task.elicit(question, _ANSWER_SCHEMA))
            return await _run(name, args)

        return await ctx.experimental.run_task(work)

    return server


def _parsed(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


class _Gate:
    """The knobs, in front of the transport."""

    def __init__(self, app: ASGIApp, server: MCPServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = self.server.token
        got = dict(scope["headers"]).get(b"authorization", b"").decode()
        if token is not None and got != f"Bearer {token}":
            refusal = JSONResponse({"error": f"bad credentials: {got!r}"}, status_code=401)
            await refusal(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        sent = _parsed(body)
        if isinstance(sent, dict) and "method" not in sent and "id" in sent:
            self.server.replies.append(sent)
        if b'"tools/call"' in body:
            self.server.keys.append(dict(scope["headers"]).get(b"idempotency-key", b"").decode())
        if self.server.lose_answers > 0 and b'"tools/call"' in body:
            self.server.lose_answers -= 1

            async def dropped(_message: Message) -> None:
                return None

            await self.app(scope, replay, dropped)
            await JSONResponse({"error": "bad gateway"}, status_code=502)(scope, replay, send)
            return
        await self.app(scope, replay, send)


@dataclass
class MCPServer:
    """The server; ``url`` (its streamable HTTP endpoint) is set once started."""

    tasks: bool = True
    port: int = 0
    token: str | None = None
    json_response: bool = False
    lose_answers: int = 0
    url: str = ""
    calls: Counter[str] = field(default_factory=Counter)
    made: Counter[str] = field(default_factory=Counter)
    keys: list[str] = field(default_factory=list)
    replies: list[dict[str, Any]] = field(default_factory=list)
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    def app(self) -> ASGIApp:
        manager = StreamableHTTPSessionManager(
            app=build(self.tasks, self.calls, self.made), json_response=self.json_response
        )

        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            async with manager.run():
                yield

        app = Starlette(routes=[Mount("/mcp", app=manager.handle_request)], lifespan=lifespan)
        return _Gate(app, self)

    def start(self, ready_within: float = 20.0) -> MCPServer:
        """Serve on a loopback port (a free one unless ``port`` is set) in a daemon thread."""
        port = self.port or _free_port()
        self.url = f"http://127.0.0.1:{port}/mcp/"
        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + ready_within
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the MCP test server did not start on port {port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)


def start_mcp_server(
    *, tasks: bool = True, token: str | None = None, json_response: bool = False
) -> MCPServer:
    """A running test server on a free loopback port (``.url``; ``.stop()`` when done)."""
    return MCPServer(tasks=tasks, token=token, json_response=json_response).start()


@contextlib.contextmanager
def mcp_server_url(*, tasks: bool = True, token: str | None = None) -> Iterator[str]:
    """The URL of a test server running for the block (a fixture's body, say)."""
    server = start_mcp_server(tasks=tasks, token=token)
    try:
        yield server.url
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--no-tasks", action="store_true", help="serve without task support")
    args = parser.parse_args()
    server = MCPServer(tasks=not args.no_tasks, port=args.port).start()
    print(f"MCP test server ready at {server.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while server._thread is not None and server._thread.is_alive():
            time.sleep(0.5)


if __name__ == "__main__":
    main()
