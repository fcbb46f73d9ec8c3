"""Unit-tier fixtures: a migrated SQLite database per test, no broker, no worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from orchestration.db import dispose_engines, upgrade
from orchestration.settings import Settings
from tests.unit.support import make_settings

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
