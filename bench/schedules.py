"""The schedule pass at scale (issue 30's closing note): its time at 10,000 schedules across
100 owners, and a plain owner's worst fire lateness beside one owner's schedule storm.

    python -m bench.schedules --database-url postgresql://postgres@127.0.0.1:5432/test \
        [--schedules 10000] [--owners 100] [--seconds 20] [--json OUT]

Everything happens in databases the script creates beside ``--database-url`` and drops (a
SQLite file in a temporary folder for a ``sqlite://`` URL). Definitions and their
``schedules`` rows are bulk-inserted; fires are real launches (rows written, nothing sent:
the executor has no queue).

- ``pass``: a pass with nothing due (the steady state: one indexed statement), a pass with
  every schedule due (the share and the pass bound decide what it takes), and for reference
  the read the pass made before issue 30 (the latest version of every definition, and every
  schedule's latest fire).
- ``storm``: the beat's loop in real time (``ORCH_SCHEDULE_INTERVAL=1``) for ``--seconds``,
  with plain owners (one schedule each, ``every: 2``) alone, then beside one owner with
  ``--storm`` schedules ``every: 1`` (its budget, ``ORCH_MAX_SCHEDULES_PER_OWNER``, by
  default); the plain owners' fire lateness (``recorded_at - fire_at``) in each. A pass runs
  every second, not on the fire instants, so up to a second of lateness is the loop's own;
  ``recorded_at`` is the pass's instant, so a fire is later than it shows by up to the pass's
  time (``pass_s_max``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, insert, select

from bench.scratch import scratch_database
from orchestration.core.db import session_scope, utcnow
from orchestration.core.models import ScheduleEntry, ScheduleFire, WorkflowDefinition
from orchestration.core.settings import Settings
from orchestration.runtime.executor import Executor
from orchestration.upkeep import schedules
from orchestration.workflows import parsing
from orchestration.workflows.schedules import ScheduleSpec, next_after

STEP = {"id": "tick", "provider": "scripted", "task": "tick"}


def _settings(url: str, **overrides: Any) -> Settings:
    return Settings(
        database_url=url,
        scripted_url=url,
        broker_url="memory://",
        max_active_runs_per_owner=100_000,
        **overrides,
    )


def _seed(
    settings: Settings, owners: dict[str, tuple[int, int]], first: datetime
) -> dict[str, int]:
    """Bulk-insert, per owner, ``count`` schedules ``every`` seconds (``owners``: name to
    (count, every)), whose first fire is the first instant after ``first``."""
    definitions: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    for owner, (count, every) in owners.items():
        body = {"name": "s", "schedule": {"every": every, "overlap": "enqueue"}, "steps": [STEP]}
        parsed = parsing.parse(body, settings).as_dict()
        at = next_after(ScheduleSpec.model_validate(parsed["schedule"]), first)
        for index in range(count):
            name = f"s{index:05}"
            definitions.append(
                {
                    "owner": owner,
                    "name": name,
                    "version": 1,
                    "sha256": f"{owner}-{name}",
                    "definition": {**parsed, "name": name},
                    "created_at": first,
                }
            )
            entries.append({"owner": owner, "name": name, "version": 1, "next_fire_at": at})
    with session_scope(settings.database_url) as session:
        for start in range(0, len(definitions), 2000):
            session.execute(insert(WorkflowDefinition), definitions[start : start + 2000])
            session.execute(insert(ScheduleEntry), entries[start : start + 2000])
    return {"schedules": len(entries), "owners": len(owners)}


def _old_read(settings: Settings) -> float:
    """Seconds of the read each pass made before issue 30 (every definition's latest version
    with its body, then every schedule's latest fire)."""
    started = time.perf_counter()
    with session_scope(settings.database_url) as session:
        latest = (
            select(
                WorkflowDefinition.owner,
                WorkflowDefinition.name,
                func.max(WorkflowDefinition.version).label("version"),
            )
            .group_by(WorkflowDefinition.owner, WorkflowDefinition.name)
            .subquery()
        )
        rows = session.scalars(
            select(WorkflowDefinition).join(
                latest,
                and_(
                    WorkflowDefinition.owner == latest.c.owner,
                    WorkflowDefinition.name == latest.c.name,
                    WorkflowDefinition.version == latest.c.version,
                ),
            )
        ).all()
        [ScheduleSpec.model_validate(row.definition["schedule"]) for row in rows]
        session.execute(
            select(ScheduleFire.owner, ScheduleFire.name, func.max(ScheduleFire.fire_at)).group_by(
                ScheduleFire.owner, ScheduleFire.name
            )
        ).all()
    return time.perf_counter() - started


def _timed_pass(settings: Settings, now: datetime) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    report = schedules.fire(Executor(settings, None), settings, now)
    return time.perf_counter() - started, report


def measure_pass(database_url: str, total: int, owners: int, repeat: int) -> dict[str, Any]:
    """The pass at ``total`` schedules spread over ``owners``."""
    with scratch_database(database_url, "schedules") as url:
        settings = _settings(url)
        start = datetime(2026, 12, 1, tzinfo=UTC)
        _seed(settings, {f"owner-{n:03}": (total // owners, 60) for n in range(owners)}, start)
        idle = [_timed_pass(settings, start)[0] for _ in range(repeat)]
        old = [_old_read(settings) for _ in range(repeat)]
        full = [_timed_pass(settings, start + timedelta(seconds=60)) for _ in range(repeat)]
        return {
            "schedules": total,
            "owners": owners,
            "idle_pass_s": statistics.median(idle),
            "full_pass_s": statistics.median(seconds for seconds, _ in full),
            "full_pass_fired": statistics.median(r["launched"] + r["failed"] for _, r in full),
            "full_pass_left_first": full[0][1]["left"],
            "old_read_s": statistics.median(old),
        }


def _beat(settings: Settings, seconds: float) -> list[float]:
    """The beat's loop in real time for ``seconds``: a pass every interval (at once when the
    last one overran). Returns each pass's duration."""
    transact = Executor(settings, None)
    interval = settings.schedule_interval
    began, durations = time.monotonic(), []
    while time.monotonic() - began < seconds:
        started = time.monotonic()
        schedules.fire(transact, settings, utcnow())
        durations.append(time.monotonic() - started)
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
    return durations


def _lateness(settings: Settings, owner_prefix: str) -> list[float]:
    with session_scope(settings.database_url) as session:
        rows = session.execute(
            select(ScheduleFire.recorded_at, ScheduleFire.fire_at).where(
                ScheduleFire.owner.like(f"{owner_prefix}%")
            )
        ).all()
    return [(recorded - fired).total_seconds() for recorded, fired in rows]


def measure_storm(database_url: str, storm: int, plain: int, seconds: float) -> dict[str, Any]:
    """Plain owners' fire lateness beside one owner's storm of ``storm`` schedules."""
    with scratch_database(database_url, "storm") as url:
        settings = _settings(url, schedule_interval=1.0)
        owners = {f"plain-{n:03}": (1, 2) for n in range(plain)}
        if storm:
            owners["a-storm"] = (storm, 1)  # sorts first: before issue 30, it fired first
        _seed(settings, owners, utcnow())
        durations = _beat(settings, seconds)
        late = _lateness(settings, "plain-")
        storm_late = _lateness(settings, "a-storm")
    return {
        "storm_schedules": storm,
        "plain_owners": plain,
        "passes": len(durations),
        "pass_s_median": statistics.median(durations),
        "pass_s_max": max(durations),
        "plain_fires": len(late),
        "plain_late_max_s": max(late, default=0.0),
        "plain_late_median_s": statistics.median(late) if late else 0.0,
        "storm_fires": len(storm_late),
        "storm_late_max_s": max(storm_late, default=0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--owners", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--storm", type=int, default=100, help="the storm owner's schedules")
    parser.add_argument("--plain", type=int, default=20, help="plain owners")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    url = options.database_url
    result = {
        "pass": measure_pass(url, options.schedules, options.owners, options.repeat),
        "storm": [
            measure_storm(url, storm, options.plain, options.seconds)
            for storm in (0, options.storm)
        ],
    }
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if options.json is not None:
        options.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
