"""Watching the worker from outside while it runs the engine: Redis commands per execution
(``MONITOR``) and where the pool processes spend their time (py-spy, sampled).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from bench import engine, trace
from bench.names import LOOP
from bench.stack import Stack
from orchestration.runtime.celery_config import STEP_TASK


def redis_commands(stack: Stack, countdown: float = 0.1, hops: int = 10) -> dict[str, Any]:
    """Redis commands per hop (``MONITOR``), engine poll against bare retry, on the idle
    stack. MONITOR slows Redis down, so this runs apart from every timed measurement."""
    url = stack.settings.broker_url
    db = redis.Redis.from_url(url).connection_pool.connection_kwargs.get("db", 0)
    results: dict[str, Any] = {}
    for label in ("bare", "engine"):
        commands: list[str] = []
        stop = threading.Event()
        client = redis.Redis.from_url(url)

        def listen(
            client: redis.Redis = client,
            commands: list[str] = commands,
            stop: threading.Event = stop,
        ) -> None:
            with client.monitor() as monitor:  # type: ignore[no-untyped-call]
                for entry in monitor.listen():
                    if stop.is_set():
                        return
                    if entry.get("db") == db:
                        commands.append(str(entry["command"]).split(" ", 1)[0].upper())

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        time.sleep(0.3)
        since = time.time()
        if label == "bare":
            sent = stack.celery().send_task(
                LOOP, kwargs={"countdown": countdown, "hops": hops}, queue=stack.settings.queue
            )
            task_id = sent.id
        else:
            orch = stack.orchestrator()
            flow = engine.workflow("mon", 1, states=[["running", 3600]], poll_interval=countdown)
            run = orch.launch(flow, owner="bench-monitor", request_id=uuid.uuid4().hex)
            task_id = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = trace.read(stack.trace_dir, since)
            mine = [r for r in rows if (r.task_id == task_id if task_id else r.name == STEP_TASK)]
            if len(mine) >= hops + 1:
                break
            time.sleep(0.05)
        stop.set()
        redis.Redis.from_url(url).ping()  # wake the monitor so it sees ``stop``
        thread.join(timeout=5)
        if label == "engine":
            orch.cancel(run.id, owner="bench-monitor")
        kinds = Counter(commands)
        results[label] = {
            "executions": len(mine),
            "commands_per_execution": round(len(commands) / max(len(mine), 1), 1),
            "by_command": dict(kinds.most_common()),
        }
    return results


def worker_profile(stack: Stack, links: int, seconds: float) -> dict[str, Any]:
    """py-spy on the worker's pool children while a ``links``-step run executes: the share of
    samples spent in each of a few functions of interest (inclusive)."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return {"skipped": "py-spy is not installed in this venv"}
    orch = stack.orchestrator()
    flow = engine.workflow("spy", links, states=[["completed"]], poll_interval=0.01)
    run = orch.launch(flow, owner="bench-spy", request_id=uuid.uuid4().hex)
    time.sleep(1.0)
    outputs = []
    procs = []
    for child in stack.worker_processes()[1:]:
        out = stack.folder / f"py-spy-{child.pid}.txt"
        outputs.append(out)
        procs.append(
            subprocess.Popen(
                [
                    str(spy),
                    "record",
                    "-p",
                    str(child.pid),
                    "-d",
                    str(int(seconds)),
                    "-r",
                    "200",
                    "-f",
                    "raw",
                    "-o",
                    str(out),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    for proc in procs:
        proc.wait()
    stack.orchestrator().cancel(run.id, owner="bench-spy")
    return _fold(outputs)


#: Frames whose inclusive share of the worker's samples the report quotes.
FRAMES = {
    "Stepper.advance": "Stepper.advance (orchestration/execution/stepper.py",
    "Session.get (loading a Run, and its steps if eager)": "Session.get (sqlalchemy/orm/session.py",
    "selectin load of Run.steps": "_SelectInLoader._load_for_path",
    "JSON decode": "JSONDecoder.raw_decode",
    "waiting on PostgreSQL": "Connection.wait (psycopg/connection.py",
    "Celery retry (publish)": "Task.retry (celery/app/task.py",
    "pydantic StepSpec validation": "BaseModel.model_validate",
    "scripted provider": "orchestration/providers/scripted.py",
}


def _fold(paths: list[Any]) -> dict[str, Any]:
    total = 0
    hits: Counter[str] = Counter()
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack_text, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            total += int(count)
            for label, needle in FRAMES.items():
                if needle in stack_text:
                    hits[label] += int(count)
    return {
        "samples": total,
        "share": {label: round(hits[label] / total, 3) if total else None for label in FRAMES},
    }
