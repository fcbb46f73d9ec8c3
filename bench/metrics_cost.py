"""Metrics cost: one ``GET /metrics`` scrape with 0, 10k and 100k runs / 1M events (PostgreSQL).

    ORCH_BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test \
        python -m bench.metrics_cost --runs 0 10000 100000 --events-per-run 10 --repeat 20

``/metrics`` is unauthenticated and scraped every few seconds, so its cost must not grow with
history (issue 10). Rows are generated in the database (``INSERT … SELECT generate_series``)
in a fresh database that is dropped afterwards, growing from one size to the next: 1 % of the
runs live, the rest spread over every terminal status, each run with ``--events-per-run``
journal rows and a few KB of workflow and args. The app is served in-process (no socket) and
scraped ``--repeat`` times after a warm-up. Reports the first scrape (which reads the settled
history once per process), the median and p90 of the next ones, and the SQL statements per
scrape, and checks that the figures served match the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, make_url

from orchestration.core.db import dispose_engines, get_engine, normalize_url, upgrade
from orchestration.core.settings import Settings
from orchestration.service import Orchestrator
from orchestration.surfaces.api.app import create_app

DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/test"

#: (status, stop_reason) of the generated runs, chosen by ``g % 100``: 0 is live, the rest
#: cycle through the terminal statuses.
_RUNS_SQL = """
INSERT INTO runs (
    id, owner, request_id, fingerprint, workflow_name, workflow, args, status, cause,
    stop_reason, error, result, created_at, started_at, finished_at, updated_at, heartbeat_at,
    cancel_requested_at, deadline_at, task_ids, current_step, rearms, needs_review
)
SELECT
    md5('run' || g), 'owner-' || (g % 50), md5('run' || g), repeat('f', 64), 'bench',
    CAST(:workflow AS jsonb), CAST(:args AS jsonb),
    kind.status, 'bench seed', kind.stop_reason,
    CASE WHEN kind.status = 'failed' THEN repeat('boom ', 100) END,
    CASE WHEN kind.status = 'completed' THEN CAST(:args AS jsonb) END,
    now() - make_interval(secs => g), now() - make_interval(secs => g),
    CASE WHEN kind.live THEN NULL ELSE now() - make_interval(secs => g) + interval '5 s' END,
    now(), now(),
    CASE WHEN kind.status = 'cancelled'
         THEN now() - make_interval(secs => g) + interval '5 s'
                    - make_interval(secs => (g % 1000) / 100.0) END,
    CASE WHEN kind.live THEN now() + interval '1 hour' END,
    '[]'::jsonb, 0, 0, false
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
CROSS JOIN LATERAL (
    SELECT g % 100 = 0 AS live,
           CASE WHEN g % 100 = 0 THEN 'running'
                ELSE (ARRAY['completed', 'failed', 'cancelled', 'timed_out', 'interrupted'])
                     [1 + g % 5] END AS status,
           CASE WHEN g % 100 = 0 THEN NULL
                ELSE (ARRAY['completed', 'step_failed', 'cancel_requested', 'step_timeout',
                            'heartbeat_lost'])[1 + g % 5] END AS stop_reason
) AS kind
"""

_EVENTS_SQL = """
INSERT INTO run_events (run_id, step_id, from_status, to_status, cause, stop_reason, at)
SELECT r.id,
       CASE WHEN k < :per_run THEN 's' || k END,
       'running',
       CASE WHEN k = :per_run THEN r.status ELSE 'running' END,
       'bench event',
       CASE WHEN k = :per_run THEN r.stop_reason END,
       r.created_at + make_interval(secs => k)
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
JOIN runs AS r ON r.id = md5('run' || g)
CROSS JOIN generate_series(1, CAST(:per_run AS int)) AS k
"""

WORKFLOW = {
    "name": "bench",
    "steps": [
        {"id": f"s{i}", "provider": "scripted", "task": "x" * 200, "with": {"states": []}}
        for i in range(5)
    ],
}


def _grow(connection: Connection, first: int, last: int, per_run: int) -> None:
    """Add runs ``first..last`` and their events, in batches that keep memory flat."""
    for start in range(first, last + 1, 20000):
        end = min(start + 19999, last)
        params = {
            "first": start,
            "last": end,
            "workflow": json.dumps(WORKFLOW),
            "args": json.dumps({"topic": "y" * 2000}),
        }
        connection.execute(text(_RUNS_SQL), params)
        connection.execute(text(_EVENTS_SQL), {"first": start, "last": end, "per_run": per_run})


def _scrape(client: TestClient) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        for family in text_string_to_metric_families(response.text)
    }


def measure(url: str, runs: int, per_run: int, repeat: int) -> dict[str, Any]:
    """Scrape ``repeat`` times against the database at ``url`` as it stands."""
    settings = Settings(database_url=url)
    app = create_app(Orchestrator(settings, None))
    # The app's engine: settings add PostgreSQL options to the URL.
    engine = get_engine(settings.database_url)
    statements = 0

    def counter(*_: Any) -> None:
        nonlocal statements
        statements += 1

    times, queries = [], []
    with TestClient(app) as client:
        # The first scrape of a process reads every terminal run once (see ``metrics.SETTLE``).
        started = time.perf_counter()
        samples = _scrape(client)
        first = time.perf_counter() - started
        for _ in range(2):
            samples = _scrape(client)
        event.listen(engine, "before_cursor_execute", counter)
        for _ in range(repeat):
            statements = 0
            started = time.perf_counter()
            samples = _scrape(client)
            times.append(time.perf_counter() - started)
            queries.append(statements)
        event.remove(engine, "before_cursor_execute", counter)
    served = samples["orchestration_runs"]
    assert samples["orchestration_metrics_database_up"][()] == 1
    assert sum(served.values()) == runs, (runs, served)
    ended = sum(v for k, v in served.items() if dict(k)["health"] == "ended")
    transitions = sum(samples["orchestration_run_terminal_transitions"].values())
    assert transitions == ended, (transitions, ended)
    times.sort()
    return {
        "runs": runs,
        "events": runs * per_run,
        "first_scrape_ms": round(first * 1000, 2),
        "median_ms": round(statistics.median(times) * 1000, 2),
        "p90_ms": round(times[int(0.9 * (len(times) - 1))] * 1000, 2),
        "statements_per_scrape": statistics.median(queries),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--database", default=os.environ.get("ORCH_BENCH_DATABASE_URL", DEFAULT_DATABASE)
    )
    parser.add_argument("--runs", type=int, nargs="+", default=[0, 10000, 100000])
    parser.add_argument("--events-per-run", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    options = parser.parse_args()
    name = f"orch_metrics_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(normalize_url(options.database), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = (
        make_url(normalize_url(options.database))
        .set(database=name)
        .render_as_string(hide_password=False)
    )
    results = []
    try:
        upgrade(url)
        loader = create_engine(normalize_url(url))
        vacuum = loader.execution_options(isolation_level="AUTOCOMMIT")
        have = 0
        for size in sorted(options.runs):
            started = time.perf_counter()
            if size > have:
                with loader.begin() as connection:
                    _grow(connection, have + 1, size, options.events_per_run)
            with vacuum.connect() as connection:
                # Index-only scans need the visibility map a bulk load has not written yet;
                # autovacuum writes it on a live database.
                connection.execute(text("VACUUM ANALYZE runs"))
                connection.execute(text("VACUUM ANALYZE run_events"))
            have = max(have, size)
            result = measure(url, size, options.events_per_run, options.repeat)
            result["load_seconds"] = round(time.perf_counter() - started, 1)
            results.append(result)
            print(json.dumps(result), flush=True)
        loader.dispose()
    finally:
        dispose_engines()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
