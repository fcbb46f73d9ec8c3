"""The databases, Redis databases and folders a page names belong to the docs tests.

A page's runnable blocks name where their state lives (``ORCH_DATABASE_URL``,
``ORCH_BROKER_URL``, ``/tmp/NAME/`` paths). Before and after the page runs, each is emptied,
so a run starts clean and leaves nothing behind: a PostgreSQL database is dropped (the page
creates it itself, as a reader must), a Redis database is flushed (unless nothing listens at
its address: a page may show what a command says then), a folder is removed so the program
has to create it. Redis database 0 is refused: it is everyone's default.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

_POSTGRES = re.compile(r"postgresql(?:\+\w+)?://[^\s'\"]+")
_REDIS = re.compile(r"redis://[^\s'\"]+")
#: A ``/tmp/NAME/`` folder, also inside ``sqlite:////tmp/NAME/...`` (four slashes).
_TMP_FOLDER = re.compile(r"(?:(?<=:///)|(?<![\w/]))/tmp/[\w.-]+(?=/)")


def named(text: str) -> tuple[list[str], list[str], list[Path]]:
    """The PostgreSQL URLs, Redis URLs and ``/tmp`` folders that ``text`` names."""
    folders = sorted({Path(m) for m in _TMP_FOLDER.findall(text)})
    return sorted(set(_POSTGRES.findall(text))), sorted(set(_REDIS.findall(text))), folders


def reset(text: str) -> None:
    """Drop, flush and remove what ``text`` names."""
    databases, brokers, folders = named(text)
    for url in databases:
        _drop_database(url)
    for url in brokers:
        _flush_redis(url)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _drop_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if name in {"", "postgres", "template0", "template1", "test"}:
        raise ValueError(f"the docs must name a database of their own, not {name!r}: {url}")
    admin = parts._replace(scheme="postgresql", path="/postgres", query="").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _flush_redis(url: str) -> None:
    import redis

    database = urlsplit(url).path.lstrip("/") or "0"
    if database == "0":
        raise ValueError(f"the docs must name a Redis database of their own, not 0: {url}")
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.flushdb()
    except redis.ConnectionError:
        pass  # nothing listens there: a page showing what a command says when it is down
    finally:
        client.close()
