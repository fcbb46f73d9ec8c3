"""Item 7: celery-director on the same work as item 1 (a chain of no-op tasks).

celery-director 0.10.0 pins ``celery==5.5.1`` and cannot be installed beside this project's
Celery 5.7, so it runs from its own virtualenv (``--director-venv``, created with
``pip install celery-director`` when missing, :mod:`bench.peers.venv`). Its worker runs on
the same Redis, with the same flags (prefork, ``-c 2``, ``acks_late``, prefetch 1, JSON), its
database is a fresh PostgreSQL database, and its chain has the same number of task links.
Director wraps every chain in a ``start`` and an ``end`` task, and its ``end`` task sleeps
0.5 s before closing the workflow (``director/tasks/workflows.py``); the per-link figure is
quoted with and without it.

With item 1 in the same run, director's chains are timed in item 1's rounds, beside the
engine's, the bare chain's and the other peers' (``bench.peers.lineup``; :class:`Director`
keeps its worker up meanwhile, at the lowest priority outside its own turns): the ratio then
compares chains run seconds apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import stats
from bench.peers.venv import ensure
from bench.scratch import fresh_database
from bench.stack import WORKER_FLAGS

HERE = Path(__file__).resolve().parent / "director"
#: Director's ``end`` task sleeps this long before it marks the workflow done.
END_SLEEP_S = 0.5


def _home(folder: Path, database_url: str, broker_url: str, queue: str, links: int) -> Path:
    home = folder / "director-home"
    (home / "tasks").mkdir(parents=True)
    shutil.copy(HERE / "app.py", home / "bench_director_app.py")
    shutil.copy(HERE / "noop.py", home / "tasks" / "noop.py")
    tasks = "\n".join("    - NOOP" for _ in range(links))
    (home / "workflows.yml").write_text(f"bench.CHAIN:\n  queue: {queue}\n  tasks:\n{tasks}\n")
    (home / ".env").write_text(
        f'DIRECTOR_DATABASE_URI="{database_url}"\n'
        f'DIRECTOR_BROKER_URI="{broker_url}"\n'
        f'DIRECTOR_RESULT_BACKEND_URI="{broker_url}"\n'
        "DIRECTOR_DEFAULT_RETENTION_OFFSET=-1\n"
    )
    return home


@dataclass
class Director:
    """Director's worker, database and workflow, up for as long as the ``with`` block: its
    chains can then be timed between the engine's and the bare chain's (item 1), so drift on
    the shared machine hits all three alike."""

    venv: Path
    admin_url: str
    broker_url: str
    folder: Path
    links: int
    skipped: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    statuses: list[str | None] = field(default_factory=list)
    _env: dict[str, str] = field(default_factory=dict)
    _home: Path | None = None
    _worker: int | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __enter__(self) -> Director:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _start(self) -> None:
        self.skipped = ensure(self.venv, "celery-director", "director")
        if self.skipped is not None:
            return
        self.versions = _versions(self.venv)
        name = f"orch_bench_director_{uuid.uuid4().hex[:6]}"
        url, drop = fresh_database(self.admin_url, self.folder, name)
        if drop is not None:
            self._stack.callback(drop)
        database_url = url.replace("postgresql+psycopg://", "postgresql://")
        queue = f"q-{name}"
        self._home = _home(self.folder, database_url, self.broker_url, queue, self.links)
        self._env = {
            **os.environ,
            "DIRECTOR_HOME": str(self._home),
            "PYTHONPATH": str(self._home),
            "PATH": f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self._env.pop("VIRTUAL_ENV", None)
        upgrade = subprocess.run(
            [str(self.venv / "bin" / "director"), "db", "upgrade"],
            env=self._env,
            cwd=self._home,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if upgrade.returncode:
            self.skipped = f"director db upgrade failed: {upgrade.stderr[-2000:]}"
            return
        log = self._stack.enter_context((self.folder / "director-worker.log").open("ab"))
        worker = subprocess.Popen(
            [
                str(self.venv / "bin" / "celery"),
                "-A",
                "bench_director_app:cel",
                "worker",
                *WORKER_FLAGS,
                "-n",
                f"{name}@%h",
                "-Q",
                queue,
                "-l",
                "WARNING",
            ],
            env=self._env,
            cwd=self._home,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._stack.callback(_stop, worker)
        self._worker = worker.pid
        deadline = time.monotonic() + 60
        while len(psutil.Process(worker.pid).children()) < 2:
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("director worker did not start; see director-worker.log")
            time.sleep(0.1)
        # One short warm-up chain (imports, connections), then the timed ones.
        self.skipped = self._drive(1, 120)

    def groups(self) -> list[int]:
        """The worker's process group (its pool's processes with it), while it is up."""
        return [self._worker] if self._worker is not None else []

    def time_chain(self) -> None:
        """Time one chain of ``links`` tasks, from its launch to its workflow's end."""
        if self.skipped is None:
            self.skipped = self._drive(1, 600, keep=True)

    def _drive(self, repeats: int, timeout: float, *, keep: bool = False) -> str | None:
        driver = [str(self.venv / "bin" / "python"), str(HERE / "driver.py")]
        done = subprocess.run(
            [*driver, str(repeats), str(timeout)],
            env=self._env,
            cwd=self._home,
            capture_output=True,
            text=True,
            timeout=timeout * repeats + 60,
        )
        if done.returncode:
            return f"director driver failed: {done.stderr[-2000:]}"
        if keep:
            result = json.loads(done.stdout.strip().splitlines()[-1])
            self.seconds.extend(result["seconds"])
            self.statuses.extend(result["statuses"])
        return None

    def result(self, interleaved: bool) -> dict[str, Any]:
        """The report's ``peer`` entry: per-link seconds, with and without the end sleep."""
        if self.skipped is not None:
            return {"skipped": self.skipped}
        return {
            "versions": self.versions,
            "links": self.links,
            "interleaved_with_engine": interleaved,
            "statuses": self.statuses,
            "per_link_s": stats.spread([s / self.links for s in self.seconds]),
            "per_link_without_end_sleep_s": stats.spread(
                [(s - END_SLEEP_S) / self.links for s in self.seconds]
            ),
        }


def _versions(venv: Path) -> dict[str, str]:
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "show", "celery-director", "celery"],
        capture_output=True,
        text=True,
    )
    return {
        block.split("\n")[0].removeprefix("Name: "): block.split("\n")[1].removeprefix("Version: ")
        for block in pip.stdout.strip().split("\n---\n")
        if block.startswith("Name:")
    }


def _stop(worker: subprocess.Popen[bytes]) -> None:
    os.killpg(worker.pid, 15)
    try:
        worker.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, 9)
