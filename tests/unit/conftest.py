"""Unit-tier fixtures: a migrated SQLite database per test, no broker, no worker."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event

from orchestration.db import dispose_engines, upgrade
from orchestration.settings import Settings
from tests.unit.support import make_settings


def _no_fsync(dbapi_connection: Any, _record: Any) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute("PRAGMA synchronous=OFF")


@pytest.fixture(scope="package", autouse=True)
def _fast_sqlite() -> Iterator[None]:
    """Throw-away databases need no durability: skip the fsync at every commit (the unit tier
    is otherwise dominated by disk latency). Only for the tests of this package."""
    event.listen(Engine, "connect", _no_fsync)
    yield
    event.remove(Engine, "connect", _no_fsync)


@pytest.fixture(autouse=True)
def _close_engines() -> Iterator[None]:
    """Each test has its own database files; close their pooled connections afterwards."""
    yield
    dispose_engines()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings on a migrated SQLite database (and a scripted store) in ``tmp_path``."""
    built = make_settings(tmp_path)
    upgrade(built.database_url)
    return built
