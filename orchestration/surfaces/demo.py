"""``orchestration demo``: the whole engine on a machine with only Python.

It starts an embedded broker, uses SQLite in a temporary folder, starts a real prefork worker
process, launches the example workflow (whose first step settles at ``idle``), shows progress
live, cancels a second run mid-flight, prints both final records, and shuts everything down
in order (worker, then broker), leaving no process and no temporary folder behind, also
when it fails or is interrupted. With ``--example NAME`` it runs ``examples/NAME.yaml``
instead, with that example's args, approving its approval steps as the demo owner.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestration.core.db import dispose_engines, upgrade
from orchestration.core.errors import ValidationError
from orchestration.core.settings import get_settings
from orchestration.core.states import RUN_TERMINAL, RunStatus
from orchestration.reads.records import RunRecord
from orchestration.runtime.celery_queue import client_queue
from orchestration.runtime.embedded import EmbeddedBroker
from orchestration.runtime.processes import start_worker
from orchestration.surfaces import display
from orchestration.workflows import load_file

EXAMPLES = Path(__file__).parents[1] / "examples"
#: Bounds shrunk so the demo's sweeper-facing numbers are small but consistent.
DEMO_SETTINGS = {
    "ORCH_HEARTBEAT_TIMEOUT": "20",
    "ORCH_MAX_POLL_INTERVAL_LIMIT": "5",
    "ORCH_PROVIDER_TIMEOUT": "5",
    "ORCH_VISIBILITY_TIMEOUT": "120",
    "ORCH_SWEEP_INTERVAL": "5",
    "ORCH_OWNER": "demo",
    # The demo grants loopback itself (the default list grants nothing): an example may
    # name a local agent service.
    "ORCH_PROVIDER_HOSTS": "localhost,127.0.0.0/8,::1",
}
#: The args each example that takes any is run with.
EXAMPLE_ARGS: dict[str, dict[str, Any]] = {
    "research": {"topic": "octopuses"},
    "publish": {"topic": "tides"},
    "shapes": {"topics": ["tides", "octopuses", "kelp"]},
}


def _table(records: list[RunRecord]) -> Table:
    table = Table("run", "workflow", "status", "step", "step status", "provider says", "polls")
    for record in records:
        step = record.steps[min(record.current_step, len(record.steps) - 1)]
        table.add_row(
            record.id[:12],
            Text(record.workflow_name),
            record.status,
            step.step_id,
            step.status,
            Text(step.last_provider_status or "-"),
            str(step.polls),
        )
    return table


def _verdict(ok: bool) -> Text:
    return Text("demo passed", style="green") if ok else Text("demo failed", style="red")


def examples() -> list[str]:
    """The example workflows ``--example`` can run."""
    return sorted(path.stem for path in EXAMPLES.glob("*.yaml") if path.stem != "endless")


def run_demo(console: Console, example: str | None = None) -> int:
    """Run the demo (or ``example``); return 0 when it ended as it should. An unknown
    example is a :class:`ValidationError` before anything starts."""
    if example is not None and example not in examples():
        raise ValidationError("example", f"unknown {example!r}; known: {', '.join(examples())}")
    folder = Path(tempfile.mkdtemp(prefix="orchestration-demo-"))
    try:
        with _engine(console, folder) as orch:
            if example is None:
                return _pair(console, orch)
            return _example(console, orch, example)
    finally:
        # The folder holds only this demo's database and worker log; the engines that keep
        # its SQLite files open go first.
        dispose_engines()
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _engine(console: Console, folder: Path) -> Iterator[Any]:
    """An embedded broker, a SQLite database and a real worker, stopped in order."""
    from orchestration.service import Orchestrator

    with EmbeddedBroker() as broker:
        env = {
            **os.environ,
            **DEMO_SETTINGS,
            "ORCH_BROKER_URL": broker.url,
            "ORCH_DATABASE_URL": f"sqlite:///{folder / 'demo.db'}",
        }
        os.environ.update(env)
        get_settings.cache_clear()
        settings = get_settings()
        upgrade(settings.database_url)
        where = f" {broker.url}, database {folder / 'demo.db'}"
        console.print(Text.assemble(("embedded broker", "bold"), where))
        worker = start_worker(env, folder / "worker.log", concurrency=2, name="demo")
        try:
            worker.wait_for_log("ready.", timeout=60)
            console.print(
                Text.assemble(("worker", "bold"), f" pid {worker.pid} ready (prefork, 2 processes)")
            )
            yield Orchestrator(settings, client_queue(settings))
        finally:
            worker.stop()


def _pair(console: Console, orch: Any) -> int:
    """One run completes (its first step settles at ``idle``), one is cancelled mid-flight."""
    first = orch.launch(
        load_file(EXAMPLES / "research.yaml"), EXAMPLE_ARGS["research"], owner="demo"
    )
    second = orch.launch(load_file(EXAMPLES / "endless.yaml"), owner="demo")
    cancel_seconds = _watch(console, orch, first.id, second.id)
    first = orch.get(first.id, owner="demo")
    second = orch.get(second.id, owner="demo")
    console.rule("final records")
    display.show(console, first)
    display.show(console, second)
    console.print(f"cancel() returned a terminal row in {cancel_seconds * 1000:.0f} ms")
    ok = first.status == RunStatus.COMPLETED and second.status == RunStatus.CANCELLED
    console.print(_verdict(ok))
    return 0 if ok else 1


def _example(console: Console, orch: Any, name: str) -> int:
    """Run one example to its end, approving each approval step as the demo owner."""
    run = orch.launch(load_file(EXAMPLES / f"{name}.yaml"), EXAMPLE_ARGS.get(name), owner="demo")
    deadline = time.monotonic() + 120
    seen = ""
    while time.monotonic() < deadline:
        record = orch.get(run.id, owner="demo")
        if RunStatus(record.status) in RUN_TERMINAL:
            break
        step = record.steps[min(record.current_step, len(record.steps) - 1)]
        line = _progress(orch, record, step)
        if line != seen:
            console.print(Text(line))
            seen = line
        if record.park_reason == "approval":
            console.print(f"approving step {step.step_id!r} as the demo owner")
            orch.approve(run.id, step.step_id, owner="demo", comment="approved by the demo")
        time.sleep(0.2)
    record = orch.get(run.id, owner="demo")
    console.rule("final record")
    display.show(console, record)
    ok = record.status == RunStatus.COMPLETED
    console.print(_verdict(ok))
    return 0 if ok else 1


def _progress(orch: Any, record: RunRecord, step: Any) -> str:
    """One line: the run's step and, for a branching step, where each branch is."""
    line = f"{record.status:<9} step {step.step_id} ({step.status}, attempt {step.attempt})"
    if step.branches:
        line += "; branches: " + ", ".join(
            f"{branch['id']}={_branch_status(orch, branch)}" for branch in step.branches
        )
    return line


def _branch_status(orch: Any, branch: dict[str, Any]) -> str:
    record = orch.get(branch["run_id"], owner="demo")
    if record.concurrency == "slot":
        return "waiting for a slot"
    attempt = record.steps[0].attempt
    return str(record.status) + (f" (attempt {attempt})" if attempt > 1 else "")


def _watch(console: Console, orch: object, first_id: str, second_id: str) -> float:
    from orchestration.service import Orchestrator

    assert isinstance(orch, Orchestrator)
    cancel_seconds = float("nan")
    deadline = time.monotonic() + 90
    table = _table([])
    # Live redraws in place on a terminal only; piped, it would print its last frame without
    # a final newline, glued to what comes next. There the final table is printed once.
    live = Live(console=console, refresh_per_second=8) if console.is_terminal else None
    with live or contextlib.nullcontext():
        while time.monotonic() < deadline:
            records = [orch.get(run_id, owner="demo") for run_id in (first_id, second_id)]
            table = _table(records)
            second = records[1]
            if second.status not in RUN_TERMINAL and second.steps[0].polls >= 3:
                started = time.perf_counter()
                cancelled = orch.cancel(second_id, owner="demo")
                cancel_seconds = time.perf_counter() - started
                table = _table([records[0], cancelled])
            if live is not None:
                live.update(table)
            if all(RunStatus(r.status) in RUN_TERMINAL for r in records):
                break
            time.sleep(0.2)
    if live is None:
        console.print(table)
    return cancel_seconds
