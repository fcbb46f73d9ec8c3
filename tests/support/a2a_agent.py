"""A real A2A agent for the a2a provider's tests and docs: the a2a-sdk's own server (JSON-RPC,
A2A 1.0) around a small executor of ours, served by uvicorn on a loopback port in a thread.

What a task does is read from its first message. A text is echoed back: the task works for
a moment, then completes with one artifact holding the text. A data part ``{"do": PLAY, ...}``
plays one of :data:`PLAYS`:

* ``complete``: works ``seconds`` (0.2), then completes with an artifact of a text part
  ``text`` (``"done"``), a data part ``data`` when given, and a file part of the UTF-8 bytes
  of ``file`` (named ``file_name``) when given;
* ``ask``: works ``seconds``, then asks ``question`` (``input-required``); the answer that
  comes back on the task completes it with ``{"answer": ANSWER}``;
* ``work``: works ``seconds`` (600), then completes: a task to cancel mid-way;
* ``fail``, ``reject``, ``auth``: works ``seconds``, then ends failed, rejected, or waits for
  authentication, saying ``reason``;
* ``message``: answers with a message, no task.

Knobs: ``token`` makes every request carry ``Authorization: Bearer TOKEN`` (a wrong one is
refused with a 401 that echoes it, as careless services do); ``hang`` holds every request
that many seconds first.

Run it alone (the docs do) with ``python -m tests.support.a2a_agent --port PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from a2a.helpers.proto_helpers import (
    new_data_part,
    new_raw_part,
    new_task_from_user_message,
    new_text_message,
    new_text_part,
)
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    TaskState,
)
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

PLAYS = ("complete", "ask", "work", "fail", "reject", "auth", "message")
#: The card's name, version and skill (what ``describe`` reads).
NAME = "test-agent"
SKILL = "echo"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _value(part: Part) -> Any:
    """A part as JSON: its text, its data, or the raw file part as the SDK's JSON has it."""
    if part.HasField("text"):
        return part.text
    if part.HasField("data"):
        return MessageToDict(part)["data"]
    return MessageToDict(part)


def _play(message: Message | None) -> dict[str, Any]:
    """The play a task's first message asks for (a text: complete, echoing it)."""
    parts = list(message.parts) if message is not None else []
    value = _value(parts[0]) if parts else ""
    if isinstance(value, dict) and value.get("do") in PLAYS:
        return value
    return {"do": "complete", "text": value if isinstance(value, str) else json.dumps(value)}


@dataclass
class Executor(AgentExecutor):
    """Plays each task; records what it was asked, for the tests to count."""

    #: Every message the executor was called with: (task id, context id, message id).
    received: list[tuple[str, str, str]] = field(default_factory=list)
    #: Tasks the executor was asked to cancel.
    cancelled: list[str] = field(default_factory=list)

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None
        self.received.append((context.task_id or "", context.context_id or "", message.message_id))
        task = context.current_task
        if task is None:
            play = _play(message)
            if play["do"] == "message":
                await event_queue.enqueue_event(
                    new_text_message("a message, not a task", context_id=context.context_id)
                )
                return
            task = new_task_from_user_message(message)
            await event_queue.enqueue_event(task)
        else:
            play = _play(task.history[0] if task.history else None)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        if task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            answer = _value(message.parts[0]) if message.parts else None
            await updater.start_work()
            await updater.add_artifact([new_data_part({"answer": answer})], name="answer")
            await updater.complete()
            return
        await updater.start_work()
        await asyncio.sleep(float(play.get("seconds", 600 if play["do"] == "work" else 0.2)))
        await self._finish(updater, play)

    async def _finish(self, updater: TaskUpdater, play: dict[str, Any]) -> None:
        def said(text: str) -> Message:
            return updater.new_agent_message([new_text_part(text)])

        reason = str(play.get("reason", f"the agent chose to {play['do']}"))
        if play["do"] == "ask":
            await updater.requires_input(said(str(play.get("question", "which branch?"))))
        elif play["do"] == "fail":
            await updater.failed(said(reason))
        elif play["do"] == "reject":
            await updater.reject(said(reason))
        elif play["do"] == "auth":
            await updater.requires_auth(said(reason))
        else:
            parts = [new_text_part(str(play.get("text", "done")))]
            if "data" in play:
                parts.append(new_data_part(play["data"]))
            if "file" in play:
                name = str(play.get("file_name", "note.txt"))
                parts.append(new_raw_part(str(play["file"]).encode(), "text/plain", name))
            await updater.add_artifact(parts, name="result")
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        assert task is not None
        self.cancelled.append(task.id)
        await TaskUpdater(event_queue, task.id, task.context_id).cancel()


def card(url: str, version: str) -> AgentCard:
    """The agent card served at ``/.well-known/agent-card.json``."""
    return AgentCard(
        name=NAME,
        description="Plays scripted tasks for the a2a provider's tests.",
        version=version,
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=[
            AgentSkill(
                id=SKILL,
                name="Echo",
                description="Echoes a text, or plays a scripted task.",
                tags=["test"],
            )
        ],
    )


class _Gate:
    """The knobs, in front of the SDK's routes."""

    def __init__(self, app: ASGIApp, agent: A2AAgent) -> None:
        self.app = app
        self.agent = agent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await asyncio.sleep(self.agent.hang)
            token = self.agent.token
            got = dict(scope["headers"]).get(b"authorization", b"").decode()
            if token is not None and got != f"Bearer {token}":
                refusal = JSONResponse({"error": f"bad credentials: {got!r}"}, status_code=401)
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


@dataclass
class A2AAgent:
    """The server and its executor; ``url`` is set once started."""

    version: str = "1.0.0"
    port: int = 0
    executor: Executor = field(default_factory=Executor)
    token: str | None = None
    hang: float = 0.0
    url: str = ""
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    def app(self) -> ASGIApp:
        agent_card = card(self.url, self.version)
        handler = DefaultRequestHandler(
            agent_executor=self.executor, task_store=InMemoryTaskStore(), agent_card=agent_card
        )

        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            yield
            await handler.aclose()

        async def restated(served: AgentCard) -> AgentCard:
            # The card states ``version`` as it is now: a test changes it under a run.
            now = AgentCard()
            now.CopyFrom(served)
            now.version = self.version
            return now

        routes = [
            *create_agent_card_routes(agent_card, card_modifier=restated),
            *create_jsonrpc_routes(handler, rpc_url="/"),
        ]
        return _Gate(Starlette(routes=routes, lifespan=lifespan), self)

    def start(self, ready_within: float = 20.0) -> A2AAgent:
        """Serve on a loopback port (a free one unless ``port`` is set) in a daemon thread."""
        port = self.port or _free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + ready_within
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the A2A test agent did not start on port {port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    def tasks_in(self, context_id: str) -> list[str]:
        """The task ids the executor saw in ``context_id``, first seen first."""
        seen: list[str] = []
        for task_id, context, _message in self.executor.received:
            if context == context_id and task_id not in seen:
                seen.append(task_id)
        return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--version", default="1.0.0", help="the version its card states")
    args = parser.parse_args()
    agent = A2AAgent(version=args.version, port=args.port).start()
    print(f"A2A test agent ready at {agent.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while agent._thread is not None and agent._thread.is_alive():
            time.sleep(0.5)


if __name__ == "__main__":
    main()
