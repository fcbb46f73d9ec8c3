"""Unit-tier fixtures: a migrated SQLite database per test, no broker, no worker."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url

from orchestration.core.db import dispose_engines, get_engine, upgrade
from orchestration.core.settings import Settings
from orchestration.providers.scripted import store_url
from tests.unit.support import make_settings


def _no_fsync(dbapi_connection: Any, _record: Any) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute("PRAGMA synchronous=OFF")


@pytest.fixture(scope="package", autouse=True)
def _fast_sqlite() -> Iterator[None]:
    """Throw-away databases need no durability: skip the fsync at every commit. Only for the
    tests of this package; their engines are closed when the package is done."""
    event.listen(Engine, "connect", _no_fsync)
    yield
    dispose_engines()
    event.remove(Engine, "connect", _no_fsync)


def close_pools(settings: Settings) -> None:
    """Close the pooled connections to a test's database files. The engines stay cached in
    ``orchestration.core.db`` (with their compiled-statement caches), so a database shared by many
    tests keeps them warm."""
    for url in {settings.database_url, store_url(settings)}:
        get_engine(url).dispose()


@pytest.fixture(scope="package")
def migrated_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One database migrated by ``db.upgrade``; each test gets a copy (a copy is ~50x faster
    than running the migrations again)."""
    template = make_settings(tmp_path_factory.mktemp("template"))
    upgrade(template.database_url)
    get_engine(template.database_url).dispose()  # checkpoints the WAL: a plain copy is whole
    return Path(make_url(template.database_url).database or "")


@pytest.fixture
def settings_factory(tmp_path: Path, migrated_template: Path) -> Iterator[Callable[..., Settings]]:
    """Build settings (``FAST`` bounds plus overrides) on a fresh migrated database."""
    built: list[Settings] = []

    def build(**overrides: Any) -> Settings:
        settings = make_settings(tmp_path, name=f"t{len(built) or ''}", **overrides)
        shutil.copyfile(migrated_template, make_url(settings.database_url).database or "")
        built.append(settings)
        return settings

    yield build
    for settings in built:
        close_pools(settings)


@pytest.fixture
def settings(settings_factory: Callable[..., Settings]) -> Settings:
    """Settings on a migrated SQLite database (and a scripted store) in ``tmp_path``."""
    return settings_factory()
