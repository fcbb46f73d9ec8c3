"""A small real agent service for the http provider tests (stdlib, threaded, loopback).

``POST /runs`` starts a turn (honouring ``Idempotency-Key``, and refusing with 408 a start
that arrived after its ``Request-Deadline``), ``GET /runs/{id}`` reports it and
``POST /runs/{id}/cancel`` stops it. A turn plays ``script``, a list of ``(word, seconds)``
pairs from its start (the last word is held), so a test scripts what the service says; knobs
make it hang, answer an error code, or demand a bearer token.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Turn:
    """One turn the service started."""

    run_id: str
    key: str | None
    task: Any
    started: float
    script: list[tuple[str, float]]
    cancelled: bool = False


@dataclass
class AgentService:
    """The service and its knobs; ``url`` is set once started."""

    script: list[tuple[str, float]] = field(default_factory=lambda: [("working", 0.3), ("done", 0)])
    output: Any = None
    error: str = "the agent gave up"
    prompt: Any = "which branch?"
    #: Seconds every request waits before answering (a hanging service).
    hang: float = 0.0
    #: Answer every start with this status code instead (e.g. 503, 400).
    start_status: int | None = None
    #: When set, requests must carry ``Authorization: Bearer <token>``; a wrong one is refused
    #: with a body that echoes it (as careless services do).
    token: str | None = None
    turns: dict[str, Turn] = field(default_factory=dict)
    start_calls: int = 0
    #: The ``Request-Deadline`` header of every start, in order (``None``: not sent).
    deadlines: list[str | None] = field(default_factory=list)
    url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> AgentService:
        """Serve on a free loopback port in a daemon thread."""
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: pytest shows failures, not access logs."""

            def do_GET(self) -> None:
                service.handle(self, "GET")

            def do_POST(self) -> None:
                service.handle(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        """Release hanging requests and close the port."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def word(self, turn: Turn) -> str:
        """What the service says about ``turn`` now."""
        if turn.cancelled:
            return "stopped"
        elapsed = time.monotonic() - turn.started
        began = 0.0
        for word, seconds in turn.script[:-1]:
            if elapsed < began + seconds:
                return word
            began += seconds
        return turn.script[-1][0]

    def handle(self, request: BaseHTTPRequestHandler, method: str) -> None:
        """Route one request."""
        if self.hang:
            self._stopping.wait(self.hang)
        if self.token is not None:
            given = request.headers.get("Authorization", "")
            if given != f"Bearer {self.token}":
                self._send(request, 401, {"detail": f"bad credentials: {given!r}"})
                return
        length = int(request.headers.get("Content-Length") or 0)
        body = json.loads(request.rfile.read(length) or b"null")
        parts = request.path.strip("/").split("/")
        if method == "POST" and parts == ["runs"]:
            self._start(request, body)
        elif method == "GET" and len(parts) == 2 and parts[0] == "runs":
            self._status(request, parts[1])
        elif method == "POST" and len(parts) == 3 and parts[0] == "runs" and parts[2] == "cancel":
            self._cancel(request, parts[1])
        else:
            self._send(request, 404, {"detail": "no such endpoint"})

    def _start(self, request: BaseHTTPRequestHandler, body: Any) -> None:
        key = request.headers.get("Idempotency-Key")
        deadline = request.headers.get("Request-Deadline")
        with self._lock:
            self.start_calls += 1
            self.deadlines.append(deadline)
            if self.start_status is not None:
                self._send(request, self.start_status, {"detail": "start refused by the knob"})
                return
            if deadline is not None and datetime.now(UTC) > datetime.fromisoformat(deadline):
                self._send(request, 408, {"detail": "the start arrived after its deadline"})
                return
            existing = next((t for t in self.turns.values() if key and t.key == key), None)
            if existing is not None:
                self._send(request, 200, {"data": {"id": existing.run_id}})
                return
            turn = Turn(
                run_id=f"turn-{len(self.turns) + 1}",
                key=key,
                task=body.get("task") if isinstance(body, dict) else body,
                started=time.monotonic(),
                script=list(self.script),
            )
            self.turns[turn.run_id] = turn
        self._send(request, 201, {"data": {"id": turn.run_id}})

    def _status(self, request: BaseHTTPRequestHandler, run_id: str) -> None:
        turn = self.turns.get(run_id)
        if turn is None:
            self._send(request, 404, {"detail": f"no turn {run_id}"})
            return
        word = self.word(turn)
        answer: dict[str, Any] = {"state": word}
        if word == "done":
            answer["result"] = self.output if self.output is not None else {"echo": turn.task}
        elif word == "failed":
            answer["failure"] = {"message": self.error}
        elif word == "waiting":
            answer["question"] = self.prompt
        self._send(request, 200, answer)

    def _cancel(self, request: BaseHTTPRequestHandler, run_id: str) -> None:
        turn = self.turns.get(run_id)
        if turn is None:
            self._send(request, 404, {"detail": f"no turn {run_id}"})
        elif self.word(turn) in ("done", "failed", "stopped"):
            self._send(request, 409, {"detail": f"turn {run_id} already finished"})
        else:
            turn.cancelled = True
            self._send(request, 202, {"state": "stopped"})

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        try:
            request.send_response(code)
            request.send_header("Content-Type", "application/json")
            request.send_header("Content-Length", str(len(data)))
            request.end_headers()
            request.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
