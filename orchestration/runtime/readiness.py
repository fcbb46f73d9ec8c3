"""Whether a process can serve what it would take, checked before it takes anything.

A worker or beat that starts on a database it cannot reach, or whose schema is behind, or
on a broker it cannot reach, would take tasks (another deployment's too, on a shared queue)
and fail each one. :func:`refuse_unfit` checks both before Celery's consumer starts and ends
the process with one line and exit status 2 instead. A command that only reads never creates
a database: :func:`require_database` refuses a SQLite file that is not there (SQLite would
create it, and its folders, on the first connection).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

from kombu.connection import Connection
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from orchestration.core.db import alembic_config, normalize_url
from orchestration.core.errors import DatabaseNotReady
from orchestration.core.settings import Settings
from orchestration.runtime.celery_queue import broker_address, cause_of

#: Longest a start-up check waits for the database or the broker to accept a connection.
CONNECT_TIMEOUT = 5.0
#: Connection attempts of the broker check: a broker restarting as the worker starts is
#: waited for about this many times :data:`CONNECT_TIMEOUT` at most.
BROKER_ATTEMPTS = 2

#: The processes found fit in this process (``orchestration worker`` checks before it starts
#: Celery, whose start-up signal would check again).
_fit: set[str] = set()


def database_address(url: str) -> str:
    """The database's URL as a reader gave it, password masked and without its query (which
    holds the connection options the settings add)."""
    return make_url(url).set(query={}).render_as_string(hide_password=True)


def first_line(exc: BaseException) -> str:
    """A driver's own first line (e.g. "connection refused"), not SQLAlchemy's SQL echo."""
    cause = getattr(exc, "orig", None) or exc
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


def missing_database(url: str) -> str | None:
    """Why ``url`` names no database yet (``None``: it may). Only a SQLite file can be told
    missing without connecting, and connecting would create it."""
    parsed = make_url(normalize_url(url))
    database = parsed.database
    if not parsed.drivername.startswith("sqlite") or not database or database == ":memory:":
        return None
    if database.startswith("file:") or Path(database).is_file():
        return None
    return (
        f"there is no database at {database_address(url)} (ORCH_DATABASE_URL): run "
        "`orchestration db upgrade` to create it, or set ORCH_DATABASE_URL to yours"
    )


def require_database(url: str) -> None:
    """Raise :class:`DatabaseNotReady` for a SQLite file that does not exist, before anything
    connects to it (and so creates it)."""
    if (problem := missing_database(url)) is not None:
        raise DatabaseNotReady(problem)


def database_problem(url: str) -> str | None:
    """Why a worker could not serve from this database (``None``: it can): missing,
    unreachable, or its schema not at this version's head revision."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    if (missing := missing_database(url)) is not None:
        return missing
    address = database_address(url)
    normal = normalize_url(url)
    connect_args = {} if normal.startswith("sqlite") else {"connect_timeout": CONNECT_TIMEOUT}
    engine = create_engine(normal, poolclass=NullPool, connect_args=connect_args)
    try:
        with engine.connect() as connection:
            current = set(MigrationContext.configure(connection).get_current_heads())
    except Exception as exc:
        return f"the database at {address} is unreachable ({first_line(exc)})"
    finally:
        engine.dispose()
    heads = set(ScriptDirectory.from_config(alembic_config(url)).get_heads())
    if not current:
        return f"the database at {address} has no schema: run `orchestration db upgrade`"
    if current != heads:
        return (
            f"the database at {address} is at revision {', '.join(sorted(current))}, not "
            f"{', '.join(sorted(heads))}: run `orchestration db upgrade`"
        )
    return None


def broker_problem(
    settings: Settings, timeout: float = CONNECT_TIMEOUT, attempts: int = 1
) -> str | None:
    """Why the broker cannot be reached, in its own words (``None``: it can), after
    ``attempts`` connections of at most ``timeout`` seconds each."""
    try:
        with Connection(  # type: ignore[no-untyped-call]
            settings.broker_url,
            connect_timeout=timeout,
            transport_options={"socket_connect_timeout": timeout},
        ) as connection:
            connection.ensure_connection(
                max_retries=attempts, interval_start=0.5, interval_step=0.5, timeout=timeout
            )
    except Exception as exc:
        return f"the broker at {broker_address(settings)} is unreachable ({cause_of(exc)})"
    return None


def refuse_unfit(settings: Settings, process: str) -> None:
    """End ``process`` (``worker`` or ``beat``) with one line and exit status 2 when its
    database or its broker cannot serve it; return when both can (at once when they could
    already in this process)."""
    if process in _fit:
        return
    problems = [
        problem
        for problem in (
            database_problem(settings.database_url),
            broker_problem(settings, attempts=BROKER_ATTEMPTS),
        )
        if problem is not None
    ]
    if problems:
        _refuse(process, "; ".join(problems))
    _fit.add(process)


def _refuse(process: str, problem: str) -> NoReturn:
    sys.stderr.write(f"error: {process} not started: {problem}\n")
    sys.stderr.flush()
    raise SystemExit(2)
