"""Unit-tier fixtures: a migrated database per test, no broker, no worker.

On SQLite (the default) each test gets a copy of one migrated file. With
``ORCH_TEST_UNIT_DATABASE=postgresql`` each xdist worker makes its own databases on the server of
``ORCH_TEST_DATABASE_URL``, migrated by the project's Alembic migrations (the status triggers
come with them); a test takes one, and its rows are deleted when it is done, so that the next
test finds it empty: deleting the rows of a few small tables costs far less than a
``TRUNCATE`` or a database cloned from a template (figures in docs/contributing.md).
"""

from __future__ import annotations

import itertools
import os
import shutil
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from orchestration.core.db import dispose_engines, get_engine, normalize_url, upgrade
from orchestration.core.settings import Settings
from orchestration.providers.scripted import store_url
from tests.conftest import DATABASE_URL, UNIT_DATABASE
from tests.unit.support import make_settings

#: Empties every table of a test's PostgreSQL database in one round trip. The replica role
#: turns the triggers off meanwhile: the status guard, and the live counts' deferred triggers,
#: which would otherwise write counts back at the commit. ``alembic_version`` stays.
_EMPTY = text(
    """
DO $$
DECLARE
    name text;
BEGIN
    SET LOCAL lock_timeout = '10s';
    SET LOCAL session_replication_role = replica;
    FOR name IN
        SELECT quote_ident(tablename) FROM pg_tables
        WHERE schemaname = current_schema() AND tablename <> 'alembic_version'
    LOOP
        EXECUTE 'DELETE FROM ' || name;
    END LOOP;
END
$$
"""
)


def _no_fsync(dbapi_connection: Any, _record: Any) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute("PRAGMA synchronous=OFF")
    elif isinstance(dbapi_connection, psycopg.Connection):
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        dbapi_connection.execute("SET synchronous_commit = off")
        dbapi_connection.autocommit = autocommit


@pytest.fixture(scope="package", autouse=True)
def _fast_sqlite() -> Iterator[None]:
    """Throw-away databases need no durability: skip the fsync at every commit (SQLite) or
    the wait for it (PostgreSQL). Only for the tests of this package; their engines are closed
    when the package is done."""
    event.listen(Engine, "connect", _no_fsync)
    yield
    dispose_engines()
    event.remove(Engine, "connect", _no_fsync)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test marked for the other dialect; a mark without a reason is refused."""
    for dialect, mark in (("sqlite", "sqlite_only"), ("postgresql", "postgresql_only")):
        marker = item.get_closest_marker(mark)
        if marker is None:
            continue
        reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
        if not reason:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{mark} needs a reason")
        if dialect != UNIT_DATABASE:
            pytest.skip(f"{mark}: {reason}")


def close_pools(settings: Settings) -> None:
    """Close the pooled connections to a test's database files. The engines stay cached in
    ``orchestration.core.db`` (with their compiled-statement caches), so a database shared by many
    tests keeps them warm."""
    for url in {settings.database_url, store_url(settings)}:
        get_engine(url).dispose()


class Databases(Protocol):
    """Where the unit tier's tests get a migrated, empty database."""

    def take(self, folder: Path, name: str, **overrides: Any) -> Settings:
        """Settings (``FAST`` bounds plus ``overrides``) on a migrated database of no rows."""

    def blank(self, folder: Path, name: str) -> Settings:
        """Settings on a database with no tables yet, for a test of the migrations."""

    def give_back(self, settings: Settings) -> None:
        """The test is done with the database of ``settings``."""

    def close(self) -> None:
        """The session is done: remove what was made."""


class SqliteDatabases:
    """One file migrated by ``db.upgrade``; each test gets a copy (a copy is ~50x faster than
    running the migrations again)."""

    def __init__(self, folder: Path) -> None:
        template = make_settings(folder)
        upgrade(template.database_url)
        get_engine(template.database_url).dispose()  # checkpoints the WAL: a plain copy is whole
        self._template = Path(make_url(template.database_url).database or "")

    def take(self, folder: Path, name: str, **overrides: Any) -> Settings:
        settings = make_settings(folder, name=name, **overrides)
        shutil.copyfile(self._template, make_url(settings.database_url).database or "")
        return settings

    def blank(self, folder: Path, name: str) -> Settings:
        return make_settings(folder, name=name)

    def give_back(self, settings: Settings) -> None:
        close_pools(settings)

    def close(self) -> None:
        """Nothing to remove: the files are in pytest's temporary folders."""


class PostgresDatabases:
    """Databases of this process on a PostgreSQL server, each made and migrated when a test
    first needs one more, then emptied and reused. The scripted provider keeps its turns in the
    same database, as it does by default on PostgreSQL."""

    def __init__(self, server_url: str) -> None:
        self._server = make_url(normalize_url(server_url))
        self._admin = create_engine(self._server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self._prefix = f"orch_unit_{worker}_{uuid.uuid4().hex[:8]}"
        self._numbers = itertools.count()
        self._made: list[str] = []
        self._free: list[str] = []

    def take(self, folder: Path, name: str, **overrides: Any) -> Settings:
        if "database_url" in overrides:
            raise ValueError("the unit tier chooses the database: do not override database_url")
        if self._free:
            url = self._free.pop(0)
        else:
            url = self._create()
            upgrade(url)
        values = {"database_url": url, "scripted_url": None, **overrides}
        return make_settings(folder, name=name, **values)

    def blank(self, folder: Path, name: str) -> Settings:
        """Never reused: it is dropped with the others when the session ends."""
        return make_settings(folder, name=name, database_url=self._create(), scripted_url=None)

    def give_back(self, settings: Settings) -> None:
        url = settings.database_url
        try:
            with get_engine(url).begin() as connection:
                connection.execute(_EMPTY)
        except DBAPIError:
            # A connection the test left open still holds a lock: this database is not reused.
            self._drop(make_url(url).database or "")
            return
        self._free.append(url)
        self._free.sort()

    def close(self) -> None:
        dispose_engines()
        for name in list(self._made):
            self._drop(name)
        self._admin.dispose()

    def _create(self) -> str:
        name = f"{self._prefix}_{next(self._numbers)}"
        with self._admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        self._made.append(name)
        return self._server.set(database=name).render_as_string(hide_password=False)

    def _drop(self, name: str) -> None:
        get_engine(self._server.set(database=name).render_as_string(hide_password=False)).dispose()
        with self._admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self._made.remove(name)


@pytest.fixture(scope="session")
def unit_databases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Databases]:
    """The unit tier's databases for this process: SQLite files, or PostgreSQL databases when
    ``ORCH_TEST_UNIT_DATABASE=postgresql``."""
    databases: Databases
    if UNIT_DATABASE == "postgresql":
        assert DATABASE_URL is not None  # checked when pytest starts (tests/conftest.py)
        databases = PostgresDatabases(DATABASE_URL)
    else:
        databases = SqliteDatabases(tmp_path_factory.mktemp("template"))
    yield databases
    databases.close()


@pytest.fixture
def settings_factory(
    tmp_path: Path, unit_databases: Databases
) -> Iterator[Callable[..., Settings]]:
    """Build settings (``FAST`` bounds plus overrides) on a fresh migrated database."""
    built: list[Settings] = []

    def build(**overrides: Any) -> Settings:
        settings = unit_databases.take(tmp_path, f"t{len(built) or ''}", **overrides)
        built.append(settings)
        return settings

    yield build
    for settings in built:
        unit_databases.give_back(settings)


@pytest.fixture
def settings(settings_factory: Callable[..., Settings]) -> Settings:
    """Settings on a migrated database of no rows (and a scripted store) in ``tmp_path``."""
    return settings_factory()
