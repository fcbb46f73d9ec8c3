"""Hostile HTTP servers on 127.0.0.1, written on raw sockets so they can break HTTP's rules.

Each server plays one behaviour per connection after reading the request: flood
``102 Processing``, trickle its answer a byte at a time, never end a chunked body, send
50 MB, echo every request header in a 500, or answer well. A server records what it saw
(connections, requests, bytes it managed to send), so a test can prove that a refused call
never reached it and that a client stopped reading. With ``tls`` it speaks HTTPS.

    with HostileServer(processing_flood()) as server:
        ...  # call server.url
"""

from __future__ import annotations

import json
import socket
import socketserver
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class SeenRequest:
    """One request as the server read it (header names lower-cased)."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    #: The request line and header lines as received, up to the blank line.
    head: bytes = b""

    @property
    def size(self) -> int:
        """Bytes of the whole request on the wire."""
        return len(self.head) + 4 + len(self.body)


class Conversation:
    """One connection, as a behaviour sees it."""

    def __init__(self, sock: socket.socket, request: SeenRequest, server: HostileServer) -> None:
        self.sock = sock
        self.request = request
        self._server = server

    def send(self, data: bytes) -> None:
        """Write ``data``; ``ConnectionError`` once the client has gone (ends the behaviour)."""
        if self._server.stopping.is_set():
            raise ConnectionAbortedError("the server is stopping")
        self.sock.sendall(data)
        with self._server.lock:
            self._server.sent += len(data)

    def pause(self, seconds: float) -> None:
        """Wait, unless the server is stopping."""
        if self._server.stopping.wait(seconds):
            raise ConnectionAbortedError("the server is stopping")


Behaviour = Callable[[Conversation], None]


def _head(status: str, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def processing_flood(interval: float = 0.5) -> Behaviour:
    """``HTTP/1.1 102 Processing`` every ``interval`` seconds, for ever: each read is short."""

    def play(talk: Conversation) -> None:
        while True:
            talk.send(b"HTTP/1.1 102 Processing\r\n\r\n")
            talk.pause(interval)

    return play


def trickle_head(interval: float = 1.0) -> Behaviour:
    """A valid answer, one byte every ``interval`` seconds from its status line on."""
    body = b'{"id": "turn-1", "state": "done"}'
    answer = _head("200 OK", {"Content-Type": "application/json", "Content-Length": str(len(body))})

    def play(talk: Conversation) -> None:
        for byte in answer + body:
            talk.send(bytes([byte]))
            talk.pause(interval)

    return play


def trickle_body(interval: float = 1.0) -> Behaviour:
    """Headers at once, then a 1000-byte body one byte every ``interval`` seconds."""

    def play(talk: Conversation) -> None:
        talk.send(_head("200 OK", {"Content-Type": "application/json", "Content-Length": "1000"}))
        for _ in range(1000):
            talk.send(b" ")
            talk.pause(interval)

    return play


def endless_chunked(chunk: int = 1024, interval: float = 0.01) -> Behaviour:
    """A chunked body that never ends: a ``chunk``-byte chunk every ``interval`` seconds."""

    def play(talk: Conversation) -> None:
        talk.send(
            _head("200 OK", {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        )
        data = f"{chunk:x}\r\n".encode() + b" " * chunk + b"\r\n"
        while True:
            talk.send(data)
            talk.pause(interval)

    return play


def huge_body(size: int = 50 * 1024 * 1024, *, announce: bool = True) -> Behaviour:
    """A ``size``-byte body as fast as the client takes it, with its length announced, or
    (``announce=False``) delimited only by the connection's close."""

    def play(talk: Conversation) -> None:
        headers = {"Content-Type": "application/json"}
        if announce:
            headers["Content-Length"] = str(size)
        else:
            headers["Connection"] = "close"
        talk.send(_head("200 OK", headers))
        block = b" " * 65536
        left = size
        while left > 0:
            talk.send(block[:left])
            left -= len(block)

    return play


def echo_headers(status: str = "500 Internal Server Error") -> Behaviour:
    """A JSON error whose body repeats every request header (as careless services do), the
    last-sent first, so the interesting ones land inside any error snippet."""

    def play(talk: Conversation) -> None:
        got = dict(reversed(list(talk.request.headers.items())))
        body = json.dumps({"error": "something broke", "you_sent": got}).encode()
        talk.send(
            _head(
                status,
                {
                    "Content-Type": "application/json",
                    "Content-Length": str(len(body)),
                    "Connection": "close",
                },
            )
            + body
        )

    return play


def well_behaved(
    body: Any = None, status: str = "200 OK", headers: dict[str, str] | None = None
) -> Behaviour:
    """A prompt, complete JSON answer (``{"id": "turn-1", "state": "done", ...}`` by default),
    with ``headers`` added (e.g. a ``Location`` for a redirect)."""
    payload = json.dumps(
        {"id": "turn-1", "state": "done", "result": "ok"} if body is None else body
    ).encode()
    head = {
        "Content-Type": "application/json",
        "Content-Length": str(len(payload)),
        "Connection": "close",
        **(headers or {}),
    }

    def play(talk: Conversation) -> None:
        talk.send(_head(status, head) + payload)

    return play


def _read_request(sock: socket.socket) -> SeenRequest | None:
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        if not part or len(data) > 1024 * 1024:
            return None
        data += part
    head, _, rest = data.partition(b"\r\n\r\n")
    first, *lines = head.decode("latin-1").split("\r\n")
    method, target, _version = [*first.split(" "), "", ""][:3]
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    while len(rest) < length:
        part = sock.recv(65536)
        if not part:
            break
        rest += part
    return SeenRequest(method, target, headers, rest[:length], head)


@dataclass
class HostileServer:
    """A threaded TCP server on a free loopback port playing ``behaviour``."""

    behaviour: Behaviour
    #: Serve HTTPS with this (server-side) context.
    tls: ssl.SSLContext | None = None
    connections: int = 0
    requests: list[SeenRequest] = field(default_factory=list)
    #: Bytes the behaviour managed to hand to the kernel.
    sent: int = 0
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    _server: socketserver.ThreadingTCPServer | None = None

    def start(self) -> HostileServer:
        hostile = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                sock.settimeout(10)
                with hostile.lock:
                    hostile.connections += 1
                try:
                    if hostile.tls is not None:
                        sock = hostile.tls.wrap_socket(sock, server_side=True)
                    seen = _read_request(sock)
                    if seen is None:
                        return
                    with hostile.lock:
                        hostile.requests.append(seen)
                    hostile.behaviour(Conversation(sock, seen, hostile))
                except OSError:
                    return  # the client hung up, or the server is stopping
                finally:
                    if sock is not self.request:
                        sock.close()  # the TLS socket took over the connection

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        port = self._server.server_address[1]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HostileServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
