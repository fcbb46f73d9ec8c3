"""Service selection for the whole suite.

``ORCH_TEST_BROKER_URL`` (Redis or RabbitMQ) and ``ORCH_TEST_DATABASE_URL`` (PostgreSQL) select
real services; ``.ci/run`` sets both. Without them, integration tests run on the embedded
broker and SQLite, and the summary says so. With ``CI=true`` a missing service fails the run.

The unit tier runs on SQLite unless ``ORCH_TEST_UNIT_DATABASE=postgresql``: then its databases
are made on the server of ``ORCH_TEST_DATABASE_URL`` (``tests/unit/conftest.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
BROKER_URL = os.environ.get("ORCH_TEST_BROKER_URL")
DATABASE_URL = os.environ.get("ORCH_TEST_DATABASE_URL")
#: The database of the unit tier: ``sqlite`` (the default, no service) or ``postgresql``.
UNIT_DATABASE = os.environ.get("ORCH_TEST_UNIT_DATABASE", "").strip().lower() or "sqlite"
UNIT_DATABASES = ("sqlite", "postgresql")
_NOTES: list[str] = []
# The suite's workflows name their providers' URLs themselves, as they did before the agent
# registry; the registry's own tests turn it off (``allow_raw_urls=False``).
os.environ.setdefault("ORCH_ALLOW_RAW_URLS", "true")


def pytest_configure(config: pytest.Config) -> None:
    if IN_CI and not (BROKER_URL and DATABASE_URL):
        raise pytest.UsageError(
            "CI=true but ORCH_TEST_BROKER_URL and ORCH_TEST_DATABASE_URL are not both set: "
            "CI must test against real Redis/RabbitMQ and PostgreSQL"
        )
    if UNIT_DATABASE not in UNIT_DATABASES:
        raise pytest.UsageError(
            f"ORCH_TEST_UNIT_DATABASE={UNIT_DATABASE!r}: "
            f"expected one of {', '.join(UNIT_DATABASES)}"
        )
    if UNIT_DATABASE == "postgresql" and not _postgresql(DATABASE_URL):
        raise pytest.UsageError(
            "ORCH_TEST_UNIT_DATABASE=postgresql needs ORCH_TEST_DATABASE_URL to name a PostgreSQL "
            "server (postgresql://USER@HOST/DATABASE) on which it may create databases"
        )
    if not BROKER_URL:
        _NOTES.append("broker: embedded (fakeredis over TCP); set ORCH_TEST_BROKER_URL for Redis")
    if not DATABASE_URL:
        _NOTES.append("database: SQLite; set ORCH_TEST_DATABASE_URL for PostgreSQL")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.section("services")
    terminalreporter.write_line(f"broker:   {BROKER_URL or 'embedded'}")
    terminalreporter.write_line(f"database: {_redact(DATABASE_URL) or 'SQLite'}")
    terminalreporter.write_line(f"unit tier database: {UNIT_DATABASE}")
    for note in _NOTES:
        terminalreporter.write_line(f"NOT TESTED ON A REAL SERVICE: {note}")


def _postgresql(url: str | None) -> bool:
    if not url:
        return False
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).get_backend_name() == "postgresql"
    except ArgumentError:
        return False


def _redact(url: str | None) -> str | None:
    if url is None:
        return None
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def wait_for(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}: last={last!r}")
