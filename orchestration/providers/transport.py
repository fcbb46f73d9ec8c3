"""An httpx transport whose every call ends by one deadline, and reaches only allowed addresses.

httpx's timeouts bound each socket operation, not the call: a server that sends
``HTTP/1.1 102 Processing`` every half second, or one byte a second, keeps each read short
and the call alive for ever, and ``getaddrinfo`` takes no timeout at all. So the network
backend here resolves the host itself within the time left, checks every address against
the allow-list (:mod:`orchestration.core.egress`) and connects to the address it checked (no
second lookup, no DNS-rebinding window; TLS still verifies the URL's host name). Every read,
write and handshake is clamped to the time left, and a watchdog shuts the socket down at the
deadline, so no operation outlasts it. Redirects are the caller's business (httpx does not
follow them unless asked; :func:`bounded_client` never asks), and proxies from the
environment are ignored (a proxy would do the lookup and connect unchecked).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

import httpcore
import httpx

from orchestration.core.egress import AllowList, Resolver, resolve, system_resolver
from orchestration.core.errors import PermanentProviderError

_SOCKET_OPTION = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)
#: httpcore's errors as httpx's, most specific first (as httpx's own transport maps them).
_ERRORS: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


class Deadline:
    """The instant a call must be over by, shared by everything the call does."""

    def __init__(self, bound: float) -> None:
        self.bound = bound
        self.at = time.monotonic() + bound

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def clamp(self, timeout: float | None, error: type[Exception]) -> float:
        """``timeout`` cut to the time left; ``error`` when none is left."""
        left = self.remaining()
        if left <= 0:
            raise error(f"the call's bound of {self.bound}s is spent")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A stream whose operations end by the deadline (clamped, and a watchdog backs it)."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: Deadline) -> None:
        self._inner = inner
        self._deadline = deadline
        sock = inner.get_extra_info("socket")
        # A write loop or a TLS handshake makes several socket calls under one timeout; the
        # watchdog ends them at the deadline all the same.
        self._watchdog = threading.Timer(max(deadline.remaining(), 0.0), _shutdown, (sock,))
        self._watchdog.daemon = True
        self._watchdog.start()

    def _expired(self) -> bool:
        return self._deadline.remaining() <= 0

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            data = self._inner.read(max_bytes, self._deadline.clamp(timeout, httpcore.ReadTimeout))
        except httpcore.NetworkError:
            if self._expired():
                raise httpcore.ReadTimeout("no answer by the deadline") from None
            raise
        if not data and self._expired():
            raise httpcore.ReadTimeout("no answer by the deadline")
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            self._inner.write(buffer, self._deadline.clamp(timeout, httpcore.WriteTimeout))
        except httpcore.NetworkError:
            if self._expired():
                raise httpcore.WriteTimeout("request unsent by the deadline") from None
            raise

    def close(self) -> None:
        self._watchdog.cancel()
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = self._deadline.clamp(timeout, httpcore.ConnectTimeout)
        try:
            inner = self._inner.start_tls(ssl_context, server_hostname, left)
        except httpcore.NetworkError:
            if self._expired():
                raise httpcore.ConnectTimeout("TLS handshake unfinished at the deadline") from None
            raise
        self._watchdog.cancel()
        return _DeadlineStream(inner, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


def _shutdown(sock: socket.socket | None) -> None:
    if sock is None:
        return
    with contextlib.suppress(OSError):  # already closed: nothing is blocked on it
        sock.shutdown(socket.SHUT_RDWR)


class GuardedBackend(httpcore.NetworkBackend):
    """Resolves within the deadline, checks every address, connects to a checked one."""

    def __init__(
        self, allow: AllowList, deadline: Deadline, resolver: Resolver = system_resolver
    ) -> None:
        self._allow = allow
        self._deadline = deadline
        self._resolver = resolver
        self._tcp = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[_SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        """Raises ``PermanentProviderError`` before any connection when an address of
        ``host`` is outside the allow-list (all of them are checked: a mixed answer is
        refused, so a retry cannot land on the bad one)."""
        try:
            addresses = resolve(
                host, self._deadline.clamp(timeout, httpcore.ConnectTimeout), self._resolver
            )
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc)) from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from None
        for address in addresses:
            refusal = self._allow.refusal(host, port, address)
            if refusal is not None:
                raise PermanentProviderError(f"refused before connecting: {refusal}")
        failure: Exception = httpcore.ConnectError(f"cannot connect to {host}:{port}")
        for address in addresses:
            try:
                stream = self._tcp.connect_tcp(
                    str(address),
                    port,
                    timeout=self._deadline.clamp(timeout, httpcore.ConnectTimeout),
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:
                failure = exc
                continue
            return _DeadlineStream(stream, self._deadline)
        raise failure

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[_SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not provider addresses")

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, min(seconds, self._deadline.remaining())))


def _reraise(exc: Exception) -> NoReturn:
    """Raise ``exc`` as the httpx error callers catch; other errors (a refusal) as they are."""
    for source, target in _ERRORS:
        if isinstance(exc, source):
            raise target(str(exc)) from exc
    raise exc


class _ResponseStream(httpx.SyncByteStream):
    def __init__(self, inner: Iterable[bytes]) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._inner
        except Exception as exc:
            _reraise(exc)

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


_CONTEXTS: dict[int, ssl.SSLContext] = {}


def verifying_context() -> ssl.SSLContext:
    """The TLS context every call verifies with (the default CA bundle), made once per
    process: loading the bundle costs a call more than the call itself. A forked worker
    makes its own (the key is the process id)."""
    pid = os.getpid()
    context = _CONTEXTS.get(pid)
    if context is None:
        context = _CONTEXTS[pid] = httpx.create_ssl_context()
    return context


class BoundedTransport(httpx.BaseTransport):
    """httpx over an httpcore pool on :class:`GuardedBackend` (HTTP/1.1, no retries)."""

    def __init__(
        self,
        allow: AllowList,
        deadline: Deadline,
        *,
        resolver: Resolver = system_resolver,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context or verifying_context(),
            http1=True,
            http2=False,
            retries=0,
            network_backend=GuardedBackend(allow, deadline, resolver),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            response = self._pool.handle_request(core)
        except Exception as exc:
            _reraise(exc)
        assert isinstance(response.stream, Iterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._pool.close()


def bounded_client(
    allow: AllowList, deadline: Deadline, resolver: Resolver = system_resolver
) -> httpx.Client:
    """A client for one call: never follows redirects, ignores proxy variables."""
    return httpx.Client(
        transport=BoundedTransport(allow, deadline, resolver=resolver),
        follow_redirects=False,
        trust_env=False,
    )
