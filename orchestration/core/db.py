"""Engines, sessions and migrations.

The caller owns the transaction: domain functions take a ``Session`` and never commit; the
executor (``orchestration.runtime.executor``) opens one :func:`session_scope` per call.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    Integer,
    String,
    create_engine,
    event,
    inspect,
    literal_column,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError, NoSuchModuleError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import QueryableAttribute, Session, sessionmaker
from sqlalchemy.sql.functions import FunctionElement

from orchestration.core.errors import ConfigurationError, DatabaseNotReady

#: ``session.info`` key: whether ``orchestration.core.pieces`` may send this session's pieces as
#: one statement.
TOGETHER = "orch_together"

if TYPE_CHECKING:
    from alembic.config import Config

LOG = logging.getLogger(__name__)
#: How to install each driver this project can use, by SQLAlchemy driver name.
DRIVER_PACKAGES = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "pg8000": "pg8000",
}
#: A pooled connection idle for longer than this is pinged before use; one used more recently is
#: trusted. A connection that died inside that window (the server restarted) fails its first
#: statement, which invalidates the pool, and the caller's retry gets a fresh one: every
#: caller already has to survive a server lost between the ping and the statement.
PING_IDLE_SECONDS = 1.0
_ENGINES: dict[str, Engine] = {}
_FACTORIES: dict[str, sessionmaker[Session]] = {}
_NAME = re.compile(r"[a-z_]+")
_HasColumn = ColumnElement[Any] | QueryableAttribute[Any]


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (the only clock the domain reads by default)."""
    return datetime.now(UTC)


@functools.lru_cache(maxsize=64)
def normalize_url(url: str) -> str:
    """Use psycopg 3 for ``postgresql://`` URLs (the driver this project installs); cached,
    since every session asks."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def missing_driver_hint(driver: str, exc: ImportError) -> str:
    """One line naming the command that installs a database driver that failed to import."""
    package = DRIVER_PACKAGES.get(driver, exc.name or driver)
    return (
        f"the database driver {driver!r} is not installed (no module {exc.name!r}): "
        f"run `pip install '{package}'`"
    )


def _sqlite_folder(url: str) -> None:
    """Create a SQLite file's folder: SQLite creates the file but not its folder, and says only
    "unable to open database file" when the folder is missing."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    folder = Path(database).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create the folder {str(folder)!r} of the SQLite database: {exc.strerror}"
        ) from None


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets readers (the dashboard, ``show``) proceed while a worker writes.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _checked_in(_dbapi_connection: Any, record: Any) -> None:
    record.info["checked_in"] = time.monotonic()


def _ping_if_idle(engine: Engine) -> Any:
    """A pool ``checkout`` listener: ``pool_pre_ping`` for a connection that sat idle, none
    for one back in use within :data:`PING_IDLE_SECONDS` (under load every execution would
    otherwise pay a ``SELECT 1`` round trip per transaction)."""

    def checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("checked_in")
        if idle_since is None or time.monotonic() - idle_since < PING_IDLE_SECONDS:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError(f"pooled connection is gone: {type(exc).__name__}") from exc
        if not alive:
            raise DisconnectionError("pooled connection is gone")

    return checkout


def get_engine(url: str) -> Engine:
    """One engine per URL per process (Celery prefork children build their own after fork)."""
    url = normalize_url(url)
    if url not in _ENGINES:
        # SQL parameters hold step inputs and outputs: never put them in error messages.
        kwargs: dict[str, Any] = {"future": True, "hide_parameters": True}
        if url.startswith("sqlite"):
            _sqlite_folder(url)
            kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
        else:
            kwargs.update(pool_size=5, max_overflow=5, pool_recycle=1800)
        engine = _create_engine(url, kwargs)
        if url.startswith("sqlite"):
            event.listen(engine, "connect", _sqlite_pragmas)
        else:
            event.listen(engine.pool, "checkin", _checked_in)
            event.listen(engine.pool, "checkout", _ping_if_idle(engine))
        _ENGINES[url] = engine
        _FACTORIES[url] = sessionmaker(engine, expire_on_commit=False)
    return _ENGINES[url]


def _create_engine(url: str, kwargs: dict[str, Any]) -> Engine:
    """``create_engine``, with a missing driver or an unknown dialect as one line."""
    parsed = make_url(url)
    try:
        return create_engine(url, **kwargs)
    except NoSuchModuleError:
        raise ConfigurationError(
            f"{parsed.drivername!r} is not a database SQLAlchemy knows; use sqlite:///PATH or "
            "postgresql://USER@HOST/DATABASE"
        ) from None
    except ImportError as exc:
        raise ConfigurationError(missing_driver_hint(parsed.get_dialect().driver, exc)) from None


def dispose_engines(*, after_fork: bool = False) -> None:
    """Drop pooled connections: at shutdown close them; after a fork only forget them (they
    belong to the parent process)."""
    for engine in _ENGINES.values():
        engine.dispose(close=not after_fork)
    _ENGINES.clear()
    _FACTORIES.clear()


@functools.lru_cache(maxsize=8)
def postgresql_url(url: str) -> bool:
    """Whether ``url`` names a PostgreSQL database."""
    return make_url(normalize_url(url)).get_backend_name() == "postgresql"


def on_postgresql(session: Session) -> bool:
    """Whether ``session`` is bound to PostgreSQL: where what only PostgreSQL has (advisory
    and table locks, a transaction's own id) is used; SQLite, one writer at a time, needs none."""
    return bool(session.get_bind().dialect.name == "postgresql")


def insert_spelled(dialect: str, table: Any) -> Any:
    """``INSERT`` into ``table`` as database ``dialect`` spells it, for its ``ON CONFLICT``
    clauses (SQLAlchemy builds them per dialect; the SQL is the same on both)."""
    from sqlalchemy.dialects import postgresql, sqlite

    return (postgresql if dialect == "postgresql" else sqlite).insert(table)


def constant_in(column: _HasColumn, values: Iterable[str]) -> ColumnElement[bool]:
    """``column IN (…)`` with ``values`` written into the statement: an ``IN`` of a list is
    otherwise an expanding parameter, which SQLAlchemy renders again at every execution
    (about 0.1 ms a statement here, on the hot path's every write). For the state machine's
    constants only (a set of its enums, say): each value must be a plain lower-case name;
    they are written in sorted order, so one set always gives the same statement."""
    names = sorted(str(value) for value in values)
    if not all(_NAME.fullmatch(name) for name in names):
        raise ValueError(f"not constant names: {names!r}")
    return column.in_([constant(name) for name in names])


def constant(value: str | int) -> ColumnElement[Any]:
    """A constant of the engine's own (a status, a cause, a whole number) written into the
    statement rather than bound: a bound value is a placeholder and a cast in the SQL, and a
    statement over psycopg's 4 KiB is parsed again at every execution."""
    if isinstance(value, int):
        return literal_column(str(int(value)), Integer)
    if "'" in value or "\\" in value:
        raise ValueError(f"not a constant: {value!r}")
    return literal_column(f"'{value}'", String)


class _JsonText(FunctionElement[str]):
    """A JSON column's member as text: its clauses are the column, the key as PostgreSQL
    writes it (and any other dialect, when a statement is printed) and the path as SQLite
    writes it."""

    type = String()
    name = "json_text"
    inherit_cache = True


@compiles(_JsonText)
def _json_text(element: _JsonText, compiler: Any, **kw: Any) -> str:
    column, key, _ = element.clauses
    return f"({compiler.process(column, **kw)} ->> {compiler.process(key, **kw)})"


@compiles(_JsonText, "sqlite")
def _json_text_sqlite(element: _JsonText, compiler: Any, **kw: Any) -> str:
    column, _, path = element.clauses
    return f"json_extract({compiler.process(column, **kw)}, {compiler.process(path, **kw)})"


def json_text(column: Any, key: str) -> ColumnElement[str]:
    """``column ->> 'key'``: the member ``key`` of a JSON column as text, the key written
    into the statement (:func:`constant`)."""
    if not _NAME.fullmatch(key):
        raise ValueError(f"not a constant name: {key!r}")
    return _JsonText(column, constant(key), constant(f"$.{key}"))


@contextmanager
def session_scope(
    url: str,
    *,
    lock_timeout: float | None = None,
    autocommit: bool = False,
    together: bool = True,
) -> Iterator[Session]:
    """A session whose transaction commits when the block ends and rolls back on error.

    What should happen after the commit is the executor's (``runtime.executor``). ``lock_timeout``
    (seconds, PostgreSQL) makes a write that waits on a locked row fail instead of waiting:
    the sweeper uses it so that one frozen worker cannot hold up every run. ``autocommit``
    sends no ``BEGIN`` or ``COMMIT``: each statement commits by itself, for work that is one
    statement (a poll's entry on PostgreSQL) and so atomic without a transaction.
    ``together``: whether ``orchestration.core.pieces`` may send a decision's statements as one
    (``ORCH_SINGLE_STATEMENT``).
    """
    engine = get_engine(url)
    if autocommit:
        with (
            engine.connect() as connection,
            Session(bind=connection.execution_options(isolation_level="AUTOCOMMIT")) as session,
        ):
            session.info[TOGETHER] = together
            yield session
        return
    session = _FACTORIES[normalize_url(url)]()
    session.info[TOGETHER] = together
    try:
        if lock_timeout is not None and engine.dialect.name == "postgresql":
            session.execute(text(f"SET LOCAL lock_timeout = '{int(lock_timeout * 1000)}ms'"))
        yield session
        session.commit()
    except BaseException:
        _end_failed(session)
        raise
    finally:
        session.close()


#: A transaction is assigned an id at its first write (or row lock); until then it wrote
#: nothing.
_NOTHING_WRITTEN = "SELECT txid_current_if_assigned() IS NULL"


def _end_failed(session: Session) -> None:
    """End the transaction of a block that raised: ``ROLLBACK``, unless PostgreSQL shows that
    it wrote nothing (no transaction id assigned; a refusal read before any write), which ends
    with ``COMMIT`` instead. The two end such a transaction alike, but psycopg drops every
    prepared statement of the connection at each ``ROLLBACK``: one owner's refused launch
    would make the next request on that pooled connection, any owner's, plan its statements
    again."""
    if _wrote_nothing(session):
        session.expunge_all()  # what was never flushed stays unwritten
        session.commit()
    else:
        session.rollback()


def _wrote_nothing(session: Session) -> bool:
    """Whether PostgreSQL shows the open transaction wrote nothing. psycopg is imported here,
    where its dialect has loaded it: on SQLite every CLI command would pay its 0.09 s."""
    if session.get_transaction() is None or not on_postgresql(session):
        return False
    from psycopg.pq import TransactionStatus

    try:
        connection = session.connection()
        driver = connection.connection.driver_connection
        if driver is None or driver.info.transaction_status != TransactionStatus.INTRANS:
            return False
        return bool(connection.exec_driver_sql(_NOTHING_WRITTEN).scalar())
    except Exception:  # the check failing is no reason not to roll back
        return False


def alembic_config(url: str) -> Config:
    """An Alembic config for the migrations shipped inside the package. Alembic is imported
    here, not with the module: every CLI command and worker would pay its 0.15 s otherwise."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent.parent / "migrations"))
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (``orchestration db upgrade``). Raises
    :class:`ConfigurationError` for a missing driver or a SQLite folder that cannot be made."""
    from alembic import command

    get_engine(url)
    command.upgrade(alembic_config(url), revision)


def check_ready(url: str) -> None:
    """Raise :class:`DatabaseNotReady` when the schema has not been created."""
    if not inspect(get_engine(url)).has_table("runs"):
        raise DatabaseNotReady(
            f"the database at {make_url(normalize_url(url)).render_as_string()} has no "
            "orchestration tables; run `orchestration db upgrade` first"
        )
