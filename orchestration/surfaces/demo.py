"""``orchestration demo``: the whole engine on a machine with only Python.

It starts an embedded broker, uses SQLite in a temporary folder, starts a real prefork worker
process, launches the example workflow (whose first step settles at ``idle``), shows progress
live, cancels a second run mid-flight, prints both final records, and shuts everything down
in order (worker, then broker), leaving no process and no temporary folder behind, also
when it fails or is interrupted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from orchestration.db import dispose_engines, upgrade
from orchestration.records import RunRecord
from orchestration.runtime.celery_queue import client_queue
from orchestration.runtime.embedded import EmbeddedBroker
from orchestration.runtime.processes import start_worker
from orchestration.settings import get_settings
from orchestration.states import RUN_TERMINAL, RunStatus
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
}


def _table(records: list[RunRecord]) -> Table:
    table = Table("run", "workflow", "status", "step", "step status", "provider says", "polls")
    for record in records:
        step = record.steps[min(record.current_step, len(record.steps) - 1)]
        table.add_row(
            record.id[:12],
            record.workflow_name,
            record.status,
            step.step_id,
            step.status,
            step.last_provider_status or "-",
            str(step.polls),
        )
    return table


def run_demo(console: Console) -> int:
    """Run the demo; return 0 when the first run completed and the second was cancelled."""
    folder = Path(tempfile.mkdtemp(prefix="orchestration-demo-"))
    try:
        return _run(console, folder)
    finally:
        # The folder holds only this demo's database and worker log; the engines that keep
        # its SQLite files open go first.
        dispose_engines()
        shutil.rmtree(folder, ignore_errors=True)


def _run(console: Console, folder: Path) -> int:
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
        console.print(f"[bold]embedded broker[/] {broker.url}, database {folder / 'demo.db'}")
        worker = start_worker(env, folder / "worker.log", concurrency=2, name="demo")
        try:
            worker.wait_for_log("ready.", timeout=60)
            console.print(f"[bold]worker[/] pid {worker.pid} ready (prefork, 2 processes)")
            orch = Orchestrator(settings, client_queue(settings))
            first = orch.launch(
                load_file(EXAMPLES / "research.yaml"), {"topic": "octopuses"}, owner="demo"
            )
            second = orch.launch(load_file(EXAMPLES / "endless.yaml"), owner="demo")
            cancel_seconds = _watch(console, orch, first.id, second.id)
            first = orch.get(first.id, owner="demo")
            second = orch.get(second.id, owner="demo")
        finally:
            worker.stop()
    console.rule("final records")
    display.show(console, first)
    display.show(console, second)
    console.print(f"cancel() returned a terminal row in {cancel_seconds * 1000:.0f} ms")
    ok = first.status == RunStatus.COMPLETED and second.status == RunStatus.CANCELLED
    console.print("[green]demo passed[/]" if ok else "[red]demo failed[/]")
    return 0 if ok else 1


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
