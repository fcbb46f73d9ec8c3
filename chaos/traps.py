"""Catching a worker at an exact point of its code, from outside, without touching the engine.

A :class:`Trap` takes ``LOCK TABLE <table> IN SHARE MODE`` in its own transaction. Reads go on,
but the next worker statement that writes the table (a status change, whose trigger journals it
in ``run_events``; ``INSERT INTO scripted_turns`` while it starts a provider turn, ...) blocks
inside the worker's open transaction. ``pg_stat_activity`` shows that backend waiting on the
trap's lock (``pg_blocking_pids``: not on a row another worker holds), with
its ``application_name`` (which worker) and client port (which prefork child: the port is found
among the child's sockets in ``/proc``). The fault is then applied to that worker, SIGKILL or
SIGSTOP, exactly there, and the lock is released.

Which run the caught child was moving is read from the row locks it holds on ``runs``
(``pgrowlocks``), or, without that extension, from the step its child executed last.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from chaos.fleet import Fleet


@dataclass(frozen=True)
class Caught:
    """A worker backend blocked in the trap."""

    worker: str
    backend_pid: int
    child_pid: int | None
    query: str
    runs: list[tuple[str, str]] = field(default_factory=list)

    @property
    def run_ids(self) -> list[str]:
        return [run_id for run_id, _ in self.runs]


def _tcp_ports_by_inode() -> dict[str, int]:
    """Local port of every TCP socket connected to PostgreSQL's port 5432, by inode."""
    ports: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                next(handle)
                for line in handle:
                    parts = line.split()
                    local, remote, inode = parts[1], parts[2], parts[9]
                    if int(remote.rsplit(":", 1)[1], 16) == 5432:
                        ports[inode] = int(local.rsplit(":", 1)[1], 16)
        except OSError:
            continue
    return ports


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def child_ports(pids: list[int]) -> dict[int, set[int]]:
    """For each pid, the local ports of its connections to PostgreSQL."""
    by_inode = _tcp_ports_by_inode()
    return {
        pid: {by_inode[inode] for inode in _socket_inodes(pid) if inode in by_inode} for pid in pids
    }


class Trap:
    """Hold ``table`` so the next worker write to it blocks; see the module docstring."""

    def __init__(self, engine: Engine, observer: Engine, table: str, pattern: str) -> None:
        self.engine = engine
        self.observer = observer
        self.table = table
        self.pattern = pattern
        self.connection: Connection | None = None
        self.armed = False
        #: The trap's own backend: a worker counts as caught only while it waits on it.
        self.backend: int | None = None

    def __enter__(self) -> Trap:
        self.connection = self.engine.connect()
        try:
            self.connection.exec_driver_sql("SET LOCAL lock_timeout = '2s'")
            self.connection.exec_driver_sql(f"LOCK TABLE {self.table} IN SHARE MODE")
            self.backend = self.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            self.armed = True
        except Exception:
            self.connection.rollback()
            self.armed = False
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.connection is not None:
            try:
                self.connection.rollback()
            finally:
                self.connection.close()

    def wait(
        self,
        fleet: Fleet,
        row_locks: bool,
        timeout: float,
        accept: Callable[[Caught], bool] = lambda _: True,
        *,
        settle: float = 0.0,
    ) -> Caught | None:
        """Wait up to ``timeout`` for a blocked worker backend that ``accept`` takes.

        After ``settle`` seconds the first one caught is taken even if ``accept`` declines it.
        """
        if not self.armed:
            return None
        started = time.monotonic()
        fallback: Caught | None = None
        while time.monotonic() - started < timeout:
            for row in self._blocked():
                caught = self._identify(fleet, row_locks, row)
                if caught is None:
                    continue
                if accept(caught):
                    return caught
                fallback = fallback or caught
            if fallback is not None and settle and time.monotonic() - started > settle:
                return fallback
            time.sleep(0.02)
        return fallback if settle else None

    def _blocked(self) -> list[Any]:
        with self.observer.connect() as connection:
            return list(
                connection.execute(
                    text(
                        "SELECT pid, application_name, client_port, query "
                        "FROM pg_stat_activity WHERE datname = current_database() "
                        "AND application_name LIKE 'chaos-w%' AND wait_event_type = 'Lock' "
                        "AND :trap = ANY(pg_blocking_pids(pid)) "
                        "AND query ILIKE :pattern ORDER BY query_start"
                    ),
                    {"pattern": self.pattern, "trap": self.backend},
                ).all()
            )

    def _identify(self, fleet: Fleet, row_locks: bool, row: Any) -> Caught | None:
        worker = str(row.application_name).removeprefix("chaos-")
        if worker not in fleet.workers:
            return None
        members = fleet.members(worker)
        ports = child_ports(members)
        child = next((pid for pid, owned in ports.items() if row.client_port in owned), None)
        mine = sorted(ports.get(child, set())) if child is not None else []
        with self.observer.connect() as connection:
            backends = [
                int(pid)
                for (pid,) in connection.execute(
                    text(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND client_port = ANY(:ports)"
                    ),
                    {"ports": mine or [row.client_port]},
                ).all()
            ]
            runs: list[tuple[str, str]] = []
            if row_locks:
                runs = [
                    (str(r.id), str(r.status))
                    for r in connection.execute(
                        text(
                            "SELECT r.id, r.status FROM runs r "
                            "JOIN pgrowlocks('runs') l ON r.ctid = l.locked_row "
                            "WHERE l.pids && CAST(:pids AS integer[])"
                        ),
                        {"pids": backends},
                    ).all()
                ]
            if not runs and child is not None:
                runs = [
                    (str(r.id), str(r.status))
                    for r in connection.execute(
                        text(
                            "SELECT r.id, r.status FROM steps s JOIN runs r ON r.id = s.run_id "
                            "WHERE s.worker_pid = :child ORDER BY s.updated_at DESC LIMIT 1"
                        ),
                        {"child": child},
                    ).all()
                ]
        return Caught(worker, int(row.pid), child, str(row.query)[:120], runs)
