"""The launch-time check of provider URLs, with every lookup of one launch on one deadline.

A launch, a definition's registration and a schedule's fire check every URL the workflow
names against ``ORCH_PROVIDER_HOSTS`` (:mod:`orchestration.core.egress`). A host listed by name,
or an IP literal, needs no lookup. Every other name is looked up, and those lookups are what
a hostile workflow could multiply: one after another, hundreds of slow names would hold an
API thread for many minutes. So, inside :func:`shared_deadline`:

- the distinct names of the workflow are looked up concurrently, in a bounded pool of
  threads (:data:`POOL_THREADS`) shared by the process, and a name already being looked up
  (by this launch or another) is waited for, not looked up twice;
- all of them must answer within one budget from the moment the checks began
  (``ORCH_LAUNCH_CHECK_SECONDS``), after which the launch is refused naming the field;
- a workflow may name at most ``ORCH_MAX_LAUNCH_HOSTS`` distinct names that are not listed.

A lookup that outlasts its launch keeps its pool thread until the system resolver gives
up; meanwhile other launches' lookups queue behind it and are refused at their own budget.
Listing a service by name in ``ORCH_PROVIDER_HOSTS`` avoids the lookup altogether.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, wait
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from orchestration.core.egress import (
    Address,
    AllowList,
    Resolver,
    addresses_of,
    entry_for,
    host_port,
    ip_literal,
)
from orchestration.core.errors import ValidationError

#: Most threads the process runs launch-time lookups in, all launches together.
POOL_THREADS = 16
#: A lookup thread with nothing to do for this long ends (seconds).
IDLE_SECONDS = 30.0
#: The budget of a check made outside :func:`shared_deadline` (one URL on its own).
SINGLE_CHECK_SECONDS = 2.0


class _Pool:
    """The process's lookup threads and the lookups in flight, made again after a fork (a
    forked child has none of its parent's threads). Daemon threads, so that a lookup the
    system resolver never ends cannot hold up the process's exit; a thread idle for
    :data:`IDLE_SECONDS` ends."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.queue: queue.SimpleQueue[tuple[Future[list[Address]], Resolver, str]]
        self.queue = queue.SimpleQueue()
        self.threads = 0
        self.inflight: dict[tuple[Resolver, str], Future[list[Address]]] = {}
        self.lock = threading.Lock()

    def lookup(self, resolver: Resolver, host: str) -> Future[list[Address]]:
        key = (resolver, host)
        with self.lock:
            found = self.inflight.get(key)
            if found is not None:
                return found
            found = Future()
            self.inflight[key] = found
            self.queue.put((found, resolver, host))
            if self.threads < POOL_THREADS:
                self.threads += 1
                threading.Thread(target=self._work, name="launch-lookup", daemon=True).start()
        return found

    def _work(self) -> None:
        while True:
            try:
                future, resolver, host = self.queue.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self.lock:
                    if self.queue.empty():
                        self.threads -= 1
                        return
                continue
            future.set_running_or_notify_cancel()
            try:
                future.set_result(addresses_of(host, resolver))
            except BaseException as exc:  # handed to the launches waiting for it
                future.set_exception(exc)
            with self.lock:
                self.inflight.pop((resolver, host), None)


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> _Pool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = _Pool()
        return _POOL


@dataclass(frozen=True)
class _Pending:
    allow: AllowList
    host: str
    port: int
    field: str
    lookup: Future[list[Address]]


class LaunchChecks:
    """The lookups one launch needs, started as they are found, judged together."""

    def __init__(self, seconds: float, max_hosts: int) -> None:
        self.seconds = seconds
        self.max_hosts = max_hosts
        self.deadline = time.monotonic() + seconds
        self._names: dict[str, Future[list[Address]]] = {}
        self._pending: list[_Pending] = []

    def add(self, allow: AllowList, host: str, port: int, field: str, resolver: Resolver) -> None:
        """Start looking ``host`` up (unless this launch already does); ``ValidationError``
        on ``field`` when it is one name too many."""
        name = host.lower().removesuffix(".")
        if name not in self._names:
            if len(self._names) >= self.max_hosts:
                raise ValidationError(
                    field,
                    f"{host} would be name {len(self._names) + 1} of this workflow that "
                    f"ORCH_PROVIDER_HOSTS does not list, over the limit of {self.max_hosts} "
                    "(ORCH_MAX_LAUNCH_HOSTS); the operator lists the services by name in "
                    "ORCH_PROVIDER_HOSTS",
                )
            self._names[name] = _pool().lookup(resolver, host)
        # Judged after the provider's own checks returned: named as the workflow names it.
        where = _PREFIX.get() + field
        self._pending.append(_Pending(allow, host, port, where, self._names[name]))

    def finish(self) -> None:
        """Wait for the lookups until the budget is spent; the first URL (in the order they
        were added) that is refused or not answered in time raises ``ValidationError``."""
        wait([item.lookup for item in self._pending], max(0.0, self.deadline - time.monotonic()))
        for item in self._pending:
            _judge(item, self.seconds)


def _judge(item: _Pending, seconds: float) -> None:
    hint = _hint(item.host, item.port)
    if not item.lookup.done():
        raise ValidationError(
            item.field,
            f"{item.host} is not listed and looking it up took longer than this launch's "
            f"{seconds:g}s for its checks (ORCH_LAUNCH_CHECK_SECONDS); {hint}",
        )
    try:
        addresses = item.lookup.result()
    except (OSError, TimeoutError) as exc:
        raise ValidationError(item.field, f"{item.host} is not listed and {exc}; {hint}") from None
    refused = [a for a in addresses if item.allow.refusal(item.host, item.port, a) is not None]
    if refused:
        raise ValidationError(
            item.field,
            f"{item.host} port {item.port} (resolving to {refused[0]}) is not allowed; {hint}",
        )


def _hint(host: str, port: int) -> str:
    return f"add {entry_for(host, port)} to ORCH_PROVIDER_HOSTS if it is meant to be reached"


_CURRENT: ContextVar[LaunchChecks | None] = ContextVar("launch_checks", default=None)
_PREFIX: ContextVar[str] = ContextVar("launch_check_field_prefix", default="")


@contextmanager
def fields_under(prefix: str) -> Iterator[None]:
    """Inside the block, the fields the checks add are named under ``prefix`` (a provider
    names its fields relative to ``with``; a refusal judged when the launch's block ends
    names the workflow's field, ``steps[0].with.start.url``)."""
    token = _PREFIX.set(prefix)
    try:
        yield
    finally:
        _PREFIX.reset(token)


@contextmanager
def shared_deadline(seconds: float, max_hosts: int) -> Iterator[LaunchChecks]:
    """Every :func:`check_launch_url` inside the block shares one deadline, ``seconds`` from
    now, and at most ``max_hosts`` names; the lookups are judged when the block ends (a block
    that raises judges nothing). Nested blocks join the outermost."""
    outer = _CURRENT.get()
    if outer is not None:
        yield outer
        return
    checks = LaunchChecks(seconds, max_hosts)
    token = _CURRENT.set(checks)
    try:
        yield checks
    finally:
        _CURRENT.reset(token)
    checks.finish()


def check_launch_url(
    allow: AllowList,
    url: str,
    field: str,
    *,
    resolver: Resolver,
    timeout: float = SINGLE_CHECK_SECONDS,
) -> None:
    """Refuse, at launch, a URL the allow-list does not permit (``ValidationError`` on
    ``field``). A host that is not listed by name is looked up and passes only when every
    address is in a listed network: inside :func:`shared_deadline` the lookup joins the
    launch's and is judged when it ends; outside, at once, within ``timeout``. The
    connect-time check repeats this on the addresses actually used."""
    parts = url.split("/", 3)
    if "{" in "/".join(parts[:3]):
        raise ValidationError(field, "placeholders may only appear in the path, not the host")
    found = host_port(url)
    if found is None:
        raise ValidationError(field, f"must be an absolute http(s) URL, not {url!r}")
    host, port = found
    if not allow.entries:
        raise ValidationError(
            field,
            "ORCH_PROVIDER_HOSTS is empty, so no provider URL may be reached; the operator "
            f"lists the services tenants may use, e.g. ORCH_PROVIDER_HOSTS={entry_for(host, port)}",
        )
    if allow.permits_host(host, port):
        return
    if ip_literal(host) is not None:
        raise ValidationError(field, f"{host} port {port} is not allowed; {_hint(host, port)}")
    with shared_deadline(timeout, 1) as checks:
        checks.add(allow, host, port, field, resolver)
