"""Item 7: celery-director on the same work as item 1 (a chain of no-op tasks).

celery-director 0.10.0 pins ``celery==5.5.1`` and cannot be installed beside this project's
Celery 5.7, so it runs from its own virtualenv (``--director-venv``, created with
``pip install celery-director`` when missing). Its worker runs on the same Redis, with the
same flags (prefork, ``-c 2``, ``acks_late``, prefetch 1, JSON), its database is a fresh
PostgreSQL database, and its chain has the same number of task links. Director wraps every
chain in a ``start`` and an ``end`` task, and its ``end`` task sleeps 0.5 s before closing the
workflow (``director/tasks/workflows.py``); the per-link figure is quoted with and without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from bench import stats
from bench.scratch import fresh_database
from bench.stack import WORKER_FLAGS

HERE = Path(__file__).resolve().parent / "director"
#: Director's ``end`` task sleeps this long before it marks the workflow done.
END_SLEEP_S = 0.5


def ensure_venv(venv: Path) -> str | None:
    """The director virtualenv's python, installing it when missing; ``None`` and the error
    text in the report when it cannot be had."""
    python = venv / "bin" / "python"
    if (venv / "bin" / "celery").exists():
        return None
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "celery-director"],
            check=True,
            timeout=600,
            capture_output=True,
            text=True,
        )
    except subprocess.CalledProcessError as exc:
        return f"pip install celery-director failed: {(exc.stderr or '')[-2000:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not create {venv}: {exc}"
    return None


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


def run(
    venv: Path, admin_url: str, broker_url: str, folder: Path, links: int, repeats: int
) -> dict[str, Any]:
    """Director's per-link seconds for a ``links``-task chain, median over ``repeats``."""
    problem = ensure_venv(venv)
    if problem is not None:
        return {"skipped": problem}
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "show", "celery-director", "celery"],
        capture_output=True,
        text=True,
    )
    versions = {
        block.split("\n")[0].removeprefix("Name: "): block.split("\n")[1].removeprefix("Version: ")
        for block in pip.stdout.strip().split("\n---\n")
        if block.startswith("Name:")
    }
    name = f"orch_bench_director_{uuid.uuid4().hex[:6]}"
    url, drop = fresh_database(admin_url, folder, name)
    database_url = url.replace("postgresql+psycopg://", "postgresql://")
    queue = f"q-{name}"
    home = _home(folder, database_url, broker_url, queue, links)
    env = {
        **os.environ,
        "DIRECTOR_HOME": str(home),
        "PYTHONPATH": str(home),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("VIRTUAL_ENV", None)
    worker = None
    log = (folder / "director-worker.log").open("ab")
    try:
        upgrade = subprocess.run(
            [str(venv / "bin" / "director"), "db", "upgrade"],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if upgrade.returncode:
            return {"skipped": f"director db upgrade failed: {upgrade.stderr[-2000:]}"}
        worker = subprocess.Popen(
            [str(venv / "bin" / "celery"), "-A", "bench_director_app:cel", "worker",
             *WORKER_FLAGS, "-n", f"{name}@%h", "-Q", queue, "-l", "WARNING"],
            env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while len(psutil.Process(worker.pid).children()) < 2:
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("director worker did not start; see director-worker.log")
            time.sleep(0.1)
        driver = [str(venv / "bin" / "python"), str(HERE / "driver.py")]
        # One short warm-up chain (imports, connections), then the timed ones.
        warm = subprocess.run(
            [*driver, "1", "120"], env=env, cwd=home, capture_output=True, text=True, timeout=300
        )
        if warm.returncode:
            return {"skipped": f"director driver failed: {warm.stderr[-2000:]}"}
        timed = subprocess.run(
            [*driver, str(repeats), "600"],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            timeout=600 * repeats,
        )
        if timed.returncode:
            return {"skipped": f"director driver failed: {timed.stderr[-2000:]}"}
        result = json.loads(timed.stdout.strip().splitlines()[-1])
    finally:
        if worker is not None:
            os.killpg(worker.pid, 15)
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, 9)
        log.close()
        if drop is not None:
            drop()
    seconds = result["seconds"]
    return {
        "versions": versions,
        "links": links,
        "statuses": result["statuses"],
        "per_link_s": stats.spread([s / links for s in seconds]),
        "per_link_without_end_sleep_s": stats.spread([(s - END_SLEEP_S) / links for s in seconds]),
    }
