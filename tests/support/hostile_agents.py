"""Hostile agent services for the http provider, on 127.0.0.1: what a tenant can point its
steps at to hurt the fleet, for the chaos suite's hostile owners.

Each is a :class:`~tests.support.hostile_servers.HostileServer` (raw sockets, so it can break
HTTP's rules) playing one of :data:`KINDS` on every connection:

* ``drip``: a status line, then one header byte every ``interval`` seconds, never finishing;
* ``processing``: ``102 Processing`` every ``interval`` seconds, for ever;
* ``oversized``: starts turns, and reports each finished with an output of ``size`` bytes;
* ``echo``: starts turns, and reports each finished with every request header it was sent
  (a bound secret included) as its output, as careless services do.

Every server keeps the requests it read, so :meth:`HostileAgent.secrets_seen` can count the
requests that carried a secret: a server that is not the secret's bound host must see none.

    with HostileAgent("drip") as agent:
        step = agent.step("s1", timeout=10)   # an http step aimed at it
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from tests.support.hostile_servers import (
    Behaviour,
    Conversation,
    HostileServer,
    processing_flood,
    well_behaved,
)

KINDS = ("drip", "processing", "oversized", "echo")


def drip(interval: float = 0.3) -> Behaviour:
    """A status line, then a header that never ends, one byte every ``interval`` seconds."""

    def play(talk: Conversation) -> None:
        talk.send(b"HTTP/1.1 200 OK\r\nX-Drip: ")
        while True:
            talk.pause(interval)
            talk.send(b"a")

    return play


def turns(finished: Any) -> Behaviour:
    """An agent that starts a turn (its run id the ``Idempotency-Key``) and reports it
    ``completed`` with ``finished(request)`` as its output; cancels are acknowledged."""

    def play(talk: Conversation) -> None:
        request = talk.request
        if request.method == "POST" and request.target == "/runs":
            key = request.headers.get("idempotency-key", "turn")
            well_behaved({"id": key, "state": "running"})(talk)
        elif request.method == "GET" and request.target.startswith("/runs/"):
            well_behaved({"state": "completed", "result": finished(request)})(talk)
        else:
            well_behaved({"ok": True})(talk)

    return play


def _echoed(request: Any) -> dict[str, Any]:
    return {"you_sent": dict(request.headers), "path": request.target}


class HostileAgent:
    """One hostile agent service of ``kind`` (see :data:`KINDS`)."""

    def __init__(self, kind: str, *, interval: float = 0.3, size: int = 2 * 1024 * 1024) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown hostile agent {kind!r}; known: {', '.join(KINDS)}")
        self.kind = kind
        self.size = size
        behaviours = {
            "drip": lambda: drip(interval),
            "processing": lambda: processing_flood(interval),
            "oversized": lambda: turns(lambda _request: "x" * size),
            "echo": lambda: turns(_echoed),
        }
        self.server = HostileServer(behaviours[kind]())

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def host(self) -> str:
        """``127.0.0.1:port``: the entry a secret is bound to."""
        return self.url.split("://", 1)[1]

    def options(self, secret: str | None = None) -> dict[str, Any]:
        """An http step's ``with:`` aimed at this service; ``secret`` names one sent as a
        bearer token on every request."""
        options: dict[str, Any] = {
            "start": {"url": f"{self.url}/runs", "body": {"task": "{task}"}},
            "status": {"url": f"{self.url}/runs/{{run_id}}"},
            "cancel": {"url": f"{self.url}/runs/{{run_id}}/cancel"},
            "run_id_path": "id",
            "status_path": "state",
            "output_path": "result",
        }
        if secret is not None:
            options["headers"] = {"Authorization": {"secret": secret, "prefix": "Bearer "}}
        return options

    def requests(self) -> int:
        with self.server.lock:
            return len(self.server.requests)

    def secrets_seen(self, values: list[str]) -> int:
        """Requests this server read that carried any of ``values`` (head, target or body)."""
        wanted = [value.encode() for value in values if value]
        with self.server.lock:
            seen = list(self.server.requests)
        return sum(
            1
            for request in seen
            if any(value in request.head or value in request.body for value in wanted)
        )

    def describe(self) -> dict[str, Any]:
        """What the report keeps of this server."""
        with self.server.lock:
            return {
                "kind": self.kind,
                "url": self.url,
                "connections": self.server.connections,
                "requests": len(self.server.requests),
                "bytes_sent": self.server.sent,
            }

    def start(self) -> HostileAgent:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> HostileAgent:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
