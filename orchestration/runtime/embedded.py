"""The embedded broker: a Redis-protocol server in this process, for the demo and for tests
on a machine with only Python.

``memory://`` works only inside one process; a real worker is another process, so the demo
serves ``fakeredis`` over TCP on a free loopback port. Facts this relies on (checked with
kombu 5.7): kombu sends EVALSHA, so ``fakeredis[lua]`` is needed; the request handler must
disable Nagle's algorithm, or every pipelined reply waits ~40 ms; handler threads must be
daemons; and shutdown goes beat, worker, then this server (a worker left without its broker
retries for minutes).
"""

from __future__ import annotations

import threading
from types import TracebackType

from fakeredis import TcpFakeServer
from fakeredis._clients._tcp_server import TCPFakeRequestHandler


class _Handler(TCPFakeRequestHandler):
    disable_nagle_algorithm = True


class EmbeddedBroker:
    """A Redis-protocol broker on ``127.0.0.1``; use as a context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = TcpFakeServer((host, port))
        self._server.RequestHandlerClass = _Handler
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="embedded-broker", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        if isinstance(host, bytes | bytearray):
            host = host.decode()
        return f"redis://{host}:{port}/0"

    def start(self) -> EmbeddedBroker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
