"""What the engine sent to PostgreSQL while a block ran: its statements, each transaction's,
and whether each ran in autocommit; and a stepper driven as the step task drives it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event, text

from orchestration.core.db import get_engine
from orchestration.core.settings import Settings
from orchestration.execution import Stepper
from orchestration.providers.scripted import START_CALLS, TURNS
from orchestration.runtime.executor import Executor
from tests.unit.support import T0, Clock


@dataclass
class Sent:
    #: ``(first word, whether the connection was in autocommit)`` per statement.
    statements: list[tuple[str, bool]] = field(default_factory=list)
    #: ``(SQL, number of parameters)`` per statement.
    texts: list[tuple[str, int]] = field(default_factory=list)
    #: The first words of each begun transaction's statements (empty: it sent none).
    transactions: list[list[str]] = field(default_factory=list)

    @property
    def engine_transactions(self) -> list[list[str]]:
        """The transactions that sent any of the engine's statements."""
        return [statements for statements in self.transactions if statements]


@contextmanager
def sent(settings: Settings) -> Iterator[Sent]:
    """The statements sent to the engine's tables, and whether each ran in a transaction (on
    PostgreSQL the scripted provider keeps its turns in the same database: its reads are the
    provider's, not the engine's; the database's own catalogue, read once per process, is
    not the engine's either)."""
    engine = get_engine(settings.database_url)
    seen = Sent()

    def begin(_conn: Any) -> None:
        seen.transactions.append([])

    def statement(conn: Any, _cursor: Any, sql: str, params: Any, *_: Any) -> None:
        if "pg_catalog" in sql or any(table.name in sql for table in (TURNS, START_CALLS)):
            return
        # SQLite's driver (before Python 3.12) has no ``autocommit``: nothing there runs so.
        autocommit = bool(getattr(conn.connection.dbapi_connection, "autocommit", False))
        word = sql.split(None, 1)[0].upper()
        seen.statements.append((word, autocommit))
        seen.texts.append((sql, len(params)))
        if seen.transactions:
            seen.transactions[-1].append(word)

    event.listen(engine, "begin", begin)
    event.listen(engine, "before_cursor_execute", statement)
    try:
        yield seen
    finally:
        event.remove(engine, "begin", begin)
        event.remove(engine, "before_cursor_execute", statement)


def stepper_on(settings: Settings) -> tuple[Stepper, Clock]:
    """A stepper as the step task drives it, on a clock of the test's."""
    clock = Clock(T0)
    return Stepper(settings, Executor(settings, None), clock=clock, worker="it", pid=1), clock


def await_blocked(settings: Settings, what: str, seconds: float = 10.0) -> None:
    """Return once some session waits for a lock (``pg_locks``): the statement the test
    started in another thread is blocked where the test holds a row."""
    deadline = time.monotonic() + seconds
    with get_engine(settings.database_url).connect() as probe:
        while not probe.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted")).scalar():
            assert time.monotonic() < deadline, f"{what} never waited for the run row"
            time.sleep(0.01)
