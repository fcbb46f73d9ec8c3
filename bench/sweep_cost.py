"""Sweep cost: one sweeper pass with 1,000 live runs beside N terminal ones (PostgreSQL).

    python -m bench.sweep_cost --database postgresql://postgres@127.0.0.1:5432/test \
        --terminal 0 10000 100000 --live 1000 --repeat 5

Rows are bulk-inserted into a fresh database; the pass runs at a ``now`` where every live
run is healthy, so it measures the scan the sweeper pays every interval. Reports the median
pass time and the number of SQL statements per pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import create_engine, event, insert, text
from sqlalchemy.engine import make_url

from orchestration.core import status_triggers
from orchestration.core.db import get_engine, normalize_url, upgrade, utcnow
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.runtime.executor import Executor
from orchestration.upkeep.sweeper import Sweeper

WORKFLOW = {
    "name": "bench",
    "steps": [
        {
            "id": "s1",
            "provider": "scripted",
            "task": "x",
            "with": {},
            "timeout": 1800.0,
            "poll_interval": 1.0,
            "max_poll_interval": 10.0,
        }
    ],
}


def _rows(count: int, status: str, now: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    runs, steps = [], []
    terminal = status != "running"
    for _ in range(count):
        run_id = uuid.uuid4().hex
        runs.append(
            {
                "id": run_id,
                "owner": "bench",
                "request_id": run_id,
                "fingerprint": "f" * 64,
                "workflow_name": "bench",
                "workflow": WORKFLOW,
                "args": {},
                "status": status,
                "cause": "bench seed",
                "stop_reason": "completed" if terminal else None,
                "created_at": now,
                "updated_at": now,
                "heartbeat_at": now,
                "finished_at": now if terminal else None,
                "deadline_at": None if terminal else now + timedelta(hours=1),
                "task_ids": [],
                "current_step": 0,
                "rearms": 0,
                "needs_review": False,
            }
        )
        steps.append(
            {
                "run_id": run_id,
                "index": 0,
                "step_id": "s1",
                "provider": "scripted",
                "status": "completed" if terminal else "running",
                "cause": "bench seed",
                "attempt": 1,
                "polls": 1,
                "created_at": now,
                "updated_at": now,
            }
        )
    return runs, steps


def measure(admin_url: str, terminal: int, live: int, repeat: int) -> dict[str, Any]:
    name = f"orch_sweep_{uuid.uuid4().hex[:8]}"
    admin = create_engine(normalize_url(admin_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = (
        make_url(normalize_url(admin_url)).set(database=name).render_as_string(hide_password=False)
    )
    try:
        upgrade(url)
        now = utcnow()
        engine = get_engine(url)
        # Rows loaded straight into their statuses, as a restore would: the status triggers'
        # guard and journal are off for the load (a launch only ever writes ``queued``).
        with engine.begin() as connection, status_triggers.suspended(connection):
            for status, count in (("completed", terminal), ("running", live)):
                for start in range(0, count, 10000):
                    runs, steps = _rows(min(10000, count - start), status, now)
                    connection.execute(insert(Run), runs)
                    connection.execute(insert(Step), steps)
        # As autovacuum leaves a table on a live database: the visibility map and hint bits set
        # and the statistics fresh. Timing the pass right after a million-row bulk insert
        # measured the first readers setting hint bits, not the sweeper.
        vacuum = engine.execution_options(isolation_level="AUTOCOMMIT")
        with vacuum.connect() as connection:
            connection.execute(text("VACUUM ANALYZE runs"))
            connection.execute(text("VACUUM ANALYZE steps"))
        settings = Settings(database_url=url)
        sweeper = Sweeper(settings, Executor(settings, None))
        # The sweeper's engine: settings add PostgreSQL options to the URL, so it is not the
        # engine the rows were inserted with.
        engine = get_engine(settings.database_url)
        statements = 0

        def counter(*_: Any) -> None:
            nonlocal statements
            statements += 1

        event.listen(engine, "before_cursor_execute", counter)
        times, queries = [], []
        for _ in range(repeat):
            statements = 0
            started = time.perf_counter()
            report = sweeper.sweep(now + timedelta(seconds=1))
            times.append(time.perf_counter() - started)
            queries.append(statements)
            assert report["live"] == live and report["errors"] == 0, report
        event.remove(engine, "before_cursor_execute", counter)
        engine.dispose()
        return {
            "terminal": terminal,
            "live": live,
            "median_seconds": statistics.median(times),
            "min_seconds": min(times),
            "statements_per_pass": statistics.median(queries),
        }
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--terminal", type=int, nargs="+", default=[0, 10000, 100000])
    parser.add_argument("--live", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    results = [measure(options.database, n, options.live, options.repeat) for n in options.terminal]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
