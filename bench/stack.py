"""An isolated deployment for one group of measurements: a fresh database, its own queue,
its own prefork worker (``-A bench.bare_app``) with a trace folder, on the benchmark's Redis db.

Built the way ``tests/integration/conftest.py`` builds one, but without pytest: the database is
a new PostgreSQL database (dropped on close) or a SQLite file.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis
from celery import Celery

from bench.names import MARK
from bench.scratch import fresh_database
from orchestration.core.db import dispose_engines, upgrade
from orchestration.core.settings import Settings
from orchestration.runtime.celery_queue import client_queue
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator

ROOT = Path(__file__).resolve().parent.parent
#: Marks the benchmark's Redis db as ours, so a later run may flush it.
MARKER = "bench:owned-by-orchestration-bench"

#: Settings every stack shares: 200-step chains, room for 1,000+ live runs (and their turns)
#: of one owner, as an operator gives a single-tenant deployment.
BASE_SETTINGS = {
    "ORCH_MAX_STEPS": "200",
    "ORCH_MAX_ACTIVE_RUNS": "100000",
    "ORCH_MAX_ACTIVE_RUNS_PER_OWNER": "100000",
    "ORCH_MAX_LIVE_TURNS_PER_OWNER": "100000",
}

#: The worker flags every measured worker runs with (the engine's and the baseline's alike).
WORKER_FLAGS = ("-P", "prefork", "-c", "2", "--without-mingle", "--without-gossip", "-E")


def claim_redis(url: str) -> redis.Redis:
    """The benchmark's Redis db, flushed; refuse a db that holds someone else's keys."""
    client = redis.Redis.from_url(url)
    if client.dbsize() and not client.exists(MARKER):
        raise SystemExit(
            f"{url} holds {client.dbsize()} keys that are not the benchmark's; "
            "pick a free db with --redis"
        )
    client.flushdb()
    client.set(MARKER, "1")
    return client


def release_redis(client: redis.Redis) -> None:
    """Leave the db empty (queues, unacked countdown messages, director's results)."""
    client.flushdb()


@dataclass
class Stack:
    """Settings, the environment for its processes, a trace folder and its processes."""

    name: str
    settings: Settings
    env: dict[str, str]
    folder: Path
    drop: Any = None
    processes: list[ManagedProcess] = field(default_factory=list)

    @property
    def trace_dir(self) -> Path:
        return self.folder / "trace"

    def orchestrator(self) -> Orchestrator:
        return Orchestrator(self.settings, client_queue(self.settings))

    def start_worker(self, concurrency: int = 2, app: str = "bench.bare_app") -> ManagedProcess:
        """The measured worker: prefork, ``-c 2``, the stack's queue, tracing on."""
        flags = list(WORKER_FLAGS)
        flags[flags.index("-c") + 1] = str(concurrency)
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "worker",
            *flags,
            "-n",
            f"bench-{self.name}@%h",
            "-Q",
            self.settings.queue,
            "-l",
            "WARNING",
        ]
        log = self.folder / f"worker-{len(self.processes)}.log"
        worker = ManagedProcess(argv, self.env, log)
        self.processes.append(worker)
        wait_pool(worker, concurrency, timeout=60)
        self.ping(timeout=60)
        return worker

    def ping(self, timeout: float) -> float:
        """Send a bare ``mark`` through the queue and wait for it: the worker consumes."""
        key = f"bench:ping:{uuid.uuid4().hex}"
        client = redis.Redis.from_url(self.settings.broker_url)
        started = time.monotonic()
        self.celery().send_task(MARK, args=[key], queue=self.settings.queue)
        if client.blpop([key], timeout=timeout) is None:
            raise RuntimeError(f"worker did not answer a ping: ...{self.log()[-3000:]}")
        return time.monotonic() - started

    def celery(self) -> Celery:
        """The dispatch-only client app (the one ``Orchestrator`` sends through)."""
        return client_queue(self.settings).app

    def log(self) -> str:
        return "".join(process.log() for process in self.processes)

    def worker_processes(self) -> list[psutil.Process]:
        """The measured worker's main process and its pool children."""
        parent = psutil.Process(self.processes[0].pid)
        return [parent, *parent.children(recursive=True)]

    def close(self) -> None:
        for process in self.processes:
            process.stop(timeout=10)
        self.processes.clear()
        if self.drop is not None:
            self.drop()
        else:
            dispose_engines()


def wait_pool(worker: ManagedProcess, size: int, timeout: float) -> None:
    """Wait until the worker has ``size`` pool children and has consumed from Redis."""
    deadline = time.monotonic() + timeout
    parent = psutil.Process(worker.pid)
    while time.monotonic() < deadline:
        if worker.proc.poll() is not None:
            raise RuntimeError(f"worker exited: ...{worker.log()[-3000:]}")
        if len(parent.children()) >= size:
            return
        time.sleep(0.1)
    raise RuntimeError(f"worker pool not up: ...{worker.log()[-3000:]}")


def make_stack(
    admin_url: str | None,
    broker_url: str,
    tmp: Path,
    label: str,
    overrides: dict[str, str] | None = None,
) -> Stack:
    """A database, settings and environment for ``label``; no process started yet."""
    name = f"orch_bench_{label}_{uuid.uuid4().hex[:6]}".lower()
    folder = tmp / name
    folder.mkdir(parents=True)
    (folder / "trace").mkdir()
    database_url, drop = fresh_database(admin_url, folder, name)
    env = {
        **os.environ,
        **BASE_SETTINGS,
        **(overrides or {}),
        "ORCH_DATABASE_URL": database_url,
        "ORCH_BROKER_URL": broker_url,
        "ORCH_QUEUE": f"q-{name}",
        "BENCH_TRACE_DIR": str(folder / "trace"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    settings = Settings(
        **{key[5:].lower(): value for key, value in env.items() if key.startswith("ORCH_")}  # type: ignore[arg-type]
    )
    upgrade(settings.database_url)
    return Stack(name, settings, env, folder, drop)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
