"""Poll lateness from a real prefork worker: every poll that came from a countdown is counted
once, in the minute it ran, and the worker's children write what they hold as they exit."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from orchestration.core.db import session_scope
from orchestration.core.models import Step
from orchestration.service import Orchestrator
from orchestration.upkeep import fleet_series
from tests.integration.conftest import Stack
from tests.support.runs import finished

pytestmark = pytest.mark.integration


def test_a_workers_polls_are_counted_once_each_and_written_when_it_stops(
    stack: Stack, orch: Orchestrator, owner: str
) -> None:
    worker = stack.start_worker("lateness")
    flow = {
        "name": "t",
        "steps": [
            {
                "id": f"s{index}",
                "provider": "scripted",
                "task": "go",
                "poll_interval": 0.1,
                "max_poll_interval": 0.1,
                "with": {"states": [["running", 0.6], ["completed"]]},
            }
            for index in (1, 2)
        ],
    }
    runs = [orch.launch(flow, owner=owner) for _ in range(3)]
    assert {finished(orch, run.id, owner).status for run in runs} == {"completed"}
    worker.stop()
    with session_scope(stack.settings.database_url) as session:
        # Every execution but a step's first (the chain's delivery, no ETA) is a countdown's.
        executions = session.scalar(select(func.sum(Step.polls - 1)))
        rows = session.scalars(
            select(fleet_series.FleetSample).where(
                fleet_series.FleetSample.series == fleet_series.Series.POLL_LATENESS.value
            )
        ).all()
    # Six steps, each ~0.6 s at 0.1 s: about five polls each, fewer when a loaded machine
    # makes the countdowns late (29 seen under the parallel suite).
    assert executions and executions >= 6 * 2
    assert sum(row.count for row in rows) == executions
    assert {row.at.second for row in rows} == {0}  # minutes
    assert all(0 <= row.largest < 5 for row in rows), [row.largest for row in rows]
    assert all(sum(row.buckets) == row.count for row in rows)
