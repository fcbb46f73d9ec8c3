"""Integration fixtures: each test module is an isolated deployment.

A module gets a fresh database (a new PostgreSQL database, or a SQLite file), its own Celery
queue, and its own prefork worker and beat processes, so a test that kills a worker or stops
the beat never disturbs another module. Timing settings are shrunk and consistent.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from orchestration.core.db import dispose_engines, normalize_url, upgrade
from orchestration.core.settings import Settings
from orchestration.providers.scripted import ScriptedProvider
from orchestration.runtime.celery_queue import client_queue
from orchestration.runtime.embedded import EmbeddedBroker
from orchestration.runtime.processes import ManagedProcess, start_beat, start_worker
from orchestration.service import Orchestrator
from tests.conftest import BROKER_URL, DATABASE_URL

#: Shrunk bounds: a dead heartbeat is seen in ~8 s, the sweeper passes every second.
FAST_SETTINGS = {
    "ORCH_HEARTBEAT_TIMEOUT": "8",
    "ORCH_MAX_POLL_INTERVAL_LIMIT": "2",
    "ORCH_PROVIDER_TIMEOUT": "3",
    "ORCH_VISIBILITY_TIMEOUT": "60",
    "ORCH_SWEEP_INTERVAL": "1",
    "ORCH_CANCEL_GRACE": "2",
    "ORCH_MAX_REARMS": "2",
    "ORCH_PARK_BUDGET_HUMAN": "8",
    "ORCH_PARK_BUDGET_ENGINE_LIMIT": "8",
    "ORCH_PARK_BUDGET_PLATFORM_INTERRUPT": "8",
    "ORCH_PARK_BUDGET_DEFAULT": "8",
    "ORCH_EFFECT_ATTEMPTS": "3",
    "ORCH_EFFECT_BACKOFF": "0.2",
    # Loopback is granted explicitly: the default list is empty.
    "ORCH_PROVIDER_HOSTS": "localhost,127.0.0.0/8,::1",
    # Workflows name their providers' URLs themselves (the registry's tests name agents).
    "ORCH_ALLOW_RAW_URLS": "true",
}


@pytest.fixture(scope="session")
def broker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test broker: ``ORCH_TEST_BROKER_URL`` or an embedded one for the session."""
    if BROKER_URL:
        yield BROKER_URL
        return
    with EmbeddedBroker() as broker:
        yield broker.url


def _fresh_database(tmp: Path, name: str) -> tuple[str, Any]:
    if not DATABASE_URL:
        return f"sqlite:///{tmp / (name + '.db')}", None
    admin_url = normalize_url(DATABASE_URL)
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)

    def drop() -> None:
        dispose_engines()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


@dataclass
class Stack:
    """One isolated deployment: settings, environment for processes, and its processes."""

    settings: Settings
    env: dict[str, str]
    folder: Path
    processes: list[ManagedProcess] = field(default_factory=list)

    def orchestrator(self) -> Orchestrator:
        return Orchestrator(self.settings, client_queue(self.settings))

    def start_worker(self, name: str = "w", concurrency: int = 2) -> ManagedProcess:
        worker = start_worker(
            self.env,
            self.folder / f"{name}.log",
            concurrency=concurrency,
            name=f"{name}-{self.settings.queue}",
            extra=("-Q", self.settings.queue),
        )
        self.processes.append(worker)
        worker.wait_for_log("ready.", timeout=60)
        return worker

    def start_beat(self) -> ManagedProcess:
        beat = start_beat(
            self.env,
            self.folder / f"beat-{len(self.processes)}.log",
            self.folder / f"beat-schedule-{len(self.processes)}",
        )
        self.processes.append(beat)
        beat.wait_for_log("beat: Starting", timeout=30)
        return beat

    def turns(self, run_id: str) -> list[dict[str, Any]]:
        """Provider turns the scripted provider really started for ``run_id``."""
        return ScriptedProvider(self.settings).turns(run_id + ":")

    def stop(self) -> None:
        # Order: beat, then workers (a worker without its broker retries for minutes).
        for process in sorted(self.processes, key=lambda p: "beat" not in p.argv):
            process.stop()
        self.processes.clear()


def make_stack(
    tmp: Path, broker_url: str, name: str, overrides: dict[str, str] | None = None
) -> tuple[Stack, Any]:
    database_url, drop = _fresh_database(tmp, name)
    env = {
        **os.environ,
        **FAST_SETTINGS,
        **(overrides or {}),
        "ORCH_DATABASE_URL": database_url,
        "ORCH_BROKER_URL": broker_url,
        "ORCH_QUEUE": f"q-{name}",
    }
    settings = Settings(
        **{key[5:].lower(): value for key, value in env.items() if key.startswith("ORCH_")}
    )
    upgrade(settings.database_url)
    return Stack(settings, env, tmp), drop


@pytest.fixture(scope="module")
def stack(
    request: pytest.FixtureRequest,
    broker_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """An isolated deployment for this module (no processes started yet)."""
    name = f"orch_{request.module.__name__.rsplit('.', 1)[-1][:30]}_{uuid.uuid4().hex[:6]}"
    overrides = getattr(request.module, "STACK_SETTINGS", None)
    built, drop = make_stack(tmp_path_factory.mktemp(name), broker_url, name.lower(), overrides)
    yield built
    built.stop()
    if drop is not None:
        drop()


@pytest.fixture(scope="module")
def worker(stack: Stack) -> ManagedProcess:
    """A prefork worker on the module's queue."""
    return stack.start_worker()


@pytest.fixture(scope="module")
def beat(stack: Stack) -> ManagedProcess:
    """A beat process scheduling the sweeper every ``ORCH_SWEEP_INTERVAL``."""
    return stack.start_beat()


@pytest.fixture(scope="module")
def orch(stack: Stack) -> Orchestrator:
    return stack.orchestrator()


@pytest.fixture()
def owner() -> str:
    """A fresh owner per test: tests never see each other's runs."""
    return f"owner-{uuid.uuid4().hex[:10]}"
