"""A database of its own for one bench run: a new PostgreSQL database beside an admin URL
(dropped at the end) or a SQLite file in a temporary folder (removed at the end).

Apart from ``bench.stack`` so that a bench run on SQLite (the one CI makes, with only the test
extra installed) needs neither psutil nor a broker.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from orchestration.core.db import dispose_engines, normalize_url, upgrade


def fresh_database(admin_url: str | None, folder: Path, name: str) -> tuple[str, Any]:
    """A new PostgreSQL database beside ``admin_url`` (or a SQLite file); its drop function."""
    if admin_url is None:
        return f"sqlite:///{folder / (name + '.db')}", None
    admin = create_engine(normalize_url(admin_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(normalize_url(admin_url)).set(database=name)

    def drop() -> None:
        dispose_engines()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url.render_as_string(hide_password=False), drop


@contextmanager
def scratch_database(database_url: str, prefix: str) -> Iterator[str]:
    """The URL of a new, migrated database for one run (SQLite when ``database_url`` is a
    SQLite one, else beside it), gone when the block ends."""
    folder = Path(tempfile.mkdtemp(prefix=f"bench-{prefix}-"))
    admin = None if database_url.startswith("sqlite") else database_url
    url, drop = fresh_database(admin, folder, f"bench_{prefix}_{uuid.uuid4().hex[:6]}")
    try:
        upgrade(url)
        yield url
    finally:
        if drop is not None:
            drop()
        else:
            dispose_engines()
        shutil.rmtree(folder, ignore_errors=True)
