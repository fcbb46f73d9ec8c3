"""Refusing, at load, a database, broker or webhook URL the engine cannot use: one message
that says what would work, before any process starts."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from kombu.transport import TRANSPORT_ALIASES, resolve_transport
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from orchestration.core.db import missing_driver_hint, normalize_url

#: Databases the engine runs on.
DATABASES = ("sqlite", "postgresql")


def check_broker_url(value: str) -> None:
    """Refuse a broker URL whose transport kombu does not know or cannot load."""
    # kombu takes a ``;``-separated failover list, and ``TRANSPORT+URL`` (``sqla+…``).
    for url in value.split(";"):
        scheme, separator, _ = url.strip().partition("://")
        if not separator:
            raise ValueError(
                "is not a broker URL; expected TRANSPORT://…, e.g. "
                "redis://127.0.0.1:6379/0 or amqp://guest@127.0.0.1:5672//"
            )
        transport = scheme.split("+", 1)[0]
        if transport not in TRANSPORT_ALIASES:
            raise ValueError(
                f"unknown broker transport {transport!r}; expected one of "
                + ", ".join(sorted(name for name in TRANSPORT_ALIASES if name.islower()))
            )
        try:
            resolve_transport(transport)
        except ImportError as exc:
            raise ValueError(
                f"the {transport!r} transport needs the {exc.name!r} module, which is not "
                "installed (see kombu's documentation for its extra)"
            ) from None


def check_web_url(value: str) -> None:
    """Refuse a webhook URL that is not http(s) with a host."""
    try:
        parts = urlsplit(value)
        web = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # e.g. an unclosed ``[`` IPv6 literal
        web = False
    if not web or any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError(
            "must be an http:// or https:// URL with a host, e.g. "
            "https://hooks.example.com/orchestration"
        )


def check_database_url(value: str) -> URL:
    """Refuse a database URL the engine cannot use, saying what would work; the parsed URL
    (with the project's default driver) otherwise.

    A SQLite file whose folder is missing is fine when the folder can be created (the engine
    creates it, see :func:`orchestration.core.db.get_engine`).
    """
    expected = "expected sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
    try:
        url = make_url(normalize_url(value))
    except (ArgumentError, ValueError):
        raise ValueError(f"is not a database URL; {expected}") from None
    if url.get_backend_name() not in DATABASES:
        raise ValueError(f"{url.get_backend_name()!r} is not a supported database; {expected}")
    try:
        dialect = url.get_dialect()
    except NoSuchModuleError:
        raise ValueError(
            f"{url.drivername!r} is not a known SQLAlchemy driver; {expected}"
        ) from None
    if dialect.is_async:
        raise ValueError(f"{url.drivername!r} is an asyncio driver; {expected}")
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise ValueError(missing_driver_hint(dialect.driver, exc)) from None
    if url.get_backend_name() == "sqlite":
        _check_sqlite_folder(url.database)
    return url


def _check_sqlite_folder(database: str | None) -> None:
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    folder = Path(database).absolute().parent
    existing = next(parent for parent in (folder, *folder.parents) if parent.exists())
    if existing != folder and not (existing.is_dir() and os.access(existing, os.W_OK)):
        raise ValueError(
            f"the SQLite file's folder {str(folder)!r} does not exist and cannot be created "
            f"({str(existing)!r} is not a writable folder)"
        )
