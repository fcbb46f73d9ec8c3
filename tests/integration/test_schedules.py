"""Workflow schedules through a real prefork worker and TWO real beat processes (issue 14,
"Schedules"): every tick of a schedule every few seconds launches exactly one run, and
``overlap: skip`` records ``skipped`` while the previous run lives."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from sqlalchemy import select

from orchestration.core.db import session_scope
from orchestration.core.models import Run, ScheduleFire
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from tests.conftest import wait_for
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

#: The schedules' pass runs every second in both beats, racing for every fire.
STACK_SETTINGS = {"ORCH_SCHEDULE_INTERVAL": "1"}


def _flow(name: str, every: int, overlap: str, running: float) -> dict[str, Any]:
    return {
        "name": name,
        "schedule": {"every": every, "overlap": overlap, "args": {"n": 1}},
        "steps": [
            {
                "id": "work",
                "provider": "scripted",
                "task": "tick",
                "poll_interval": 0.2,
                "with": {"states": [["running", running], ["completed"]]},
            }
        ],
    }


def _detached(stack: Stack, query: Any) -> list[Any]:
    """The rows ``query`` selects, readable after their session closed."""
    with session_scope(stack.settings.database_url) as session:
        rows = list(session.scalars(query).all())
        session.expunge_all()
        return rows


def _fires(stack: Stack, owner: str, name: str) -> list[ScheduleFire]:
    return _detached(
        stack,
        select(ScheduleFire)
        .where(ScheduleFire.owner == owner, ScheduleFire.name == name)
        .order_by(ScheduleFire.fire_at),
    )


def _runs(stack: Stack, owner: str, name: str) -> list[Run]:
    return _detached(
        stack,
        select(Run).where(Run.owner == owner, Run.workflow_name == name).order_by(Run.created_at),
    )


def test_two_beats_fire_each_tick_once_and_skip_while_the_previous_run_lives(
    stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    orch.register_workflow(_flow("tick", 3, "enqueue", 0.2), owner=owner)
    orch.register_workflow(_flow("long", 2, "skip", 5.0), owner=owner)
    beats = [stack.start_beat(), stack.start_beat()]

    def long_done() -> bool:
        statuses = [fire.status for fire in _fires(stack, owner, "long")]
        return "skipped" in statuses and statuses.count("launched") >= 2

    wait_for(long_done, 30, interval=0.5, what="long: launched, skipped, launched again")
    wait_for(lambda: len(_fires(stack, owner, "tick")) >= 5, 15, interval=0.5, what="five ticks")
    for beat in beats:  # both beats were sending the pass, racing for each fire
        assert beat.log().count("Sending due task orchestration-schedules") >= 5

    ticks, tick_runs = _fires(stack, owner, "tick"), _runs(stack, owner, "tick")
    seconds = [int(fire.fire_at.timestamp()) for fire in ticks]
    assert all(second % 3 == 0 for second in seconds)
    assert [b - a for a, b in itertools.pairwise(seconds)] == [3] * (len(seconds) - 1)
    assert {fire.status for fire in ticks} == {"launched"}
    launched = {fire.run_id for fire in ticks}
    assert len(launched) == len(ticks)  # one run per tick, none shared
    assert {run.id for run in tick_runs} <= launched | {None}
    assert len(tick_runs) in (len(ticks), len(ticks) + 1)  # + a tick launched since the read
    assert len({run.request_id for run in tick_runs}) == len(tick_runs)

    long_fires, long_runs = _fires(stack, owner, "long"), _runs(stack, owner, "long")
    by_id = {run.id: run for run in long_runs}
    for fire in long_fires:
        if fire.status == "skipped":
            assert fire.reason is not None and "(overlap: skip)" in fire.reason
            blocker = by_id[fire.reason.split()[1]]
            # The run it names was live at the fire: launched before, ended after.
            assert blocker.created_at <= fire.recorded_at
            assert blocker.finished_at is None or blocker.finished_at >= fire.fire_at
    live_windows = sorted(
        (run.created_at, run.finished_at) for run in long_runs if run.finished_at is not None
    )
    for (_, ended), (started, _) in itertools.pairwise(live_windows):
        assert started >= ended  # never two runs of the skip schedule at once
