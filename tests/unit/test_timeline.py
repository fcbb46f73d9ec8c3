"""The run page's timeline (issue 14): one SVG bar per step phase, each where the journal
says the phase began and ended on the run's time axis."""

from __future__ import annotations

import re
from datetime import datetime

from fastapi.testclient import TestClient

from orchestration.core.db import session_scope, utcnow
from orchestration.core.settings import Settings
from orchestration.service import Orchestrator
from orchestration.surfaces.api import timeline, tokens
from orchestration.surfaces.api.app import create_app
from tests.unit.support import step_spec
from tests.unit.test_branches import OWNER, World


def test_each_step_phase_is_one_bar_placed_by_its_recorded_times(settings: Settings) -> None:
    world = World(settings)
    flow = {
        "name": "two",
        "steps": [
            step_spec("a", with_={"states": [["running", 0.3], ["completed"]]}),
            step_spec("b", with_={"states": [["completed"]]}),
        ],
    }
    run_id = world.launch(flow)
    world.pump()
    record = world.record(run_id)
    assert record.status == "completed"
    events = world.orch.events(run_id, owner=OWNER)
    with session_scope(settings.database_url) as session:
        token = tokens.create(session, OWNER, "t", now=utcnow())
    page = TestClient(
        create_app(Orchestrator(settings, None, clock=world.clock)),
        headers={"Authorization": f"Bearer {token}"},
    ).get(f"/dashboard/runs/{run_id}")
    assert page.status_code == 200
    bars = re.findall(
        r'<rect class="phase p-(\w+)" data-step="(\w+)" data-status="\w+" '
        r'data-start="([^"]+)" data-end="([^"]+)" x="([\d.]+)" y="(\d+)" width="([\d.]+)"',
        page.text,
    )
    entered = [(e["step_id"], e["to"]) for e in events if e["step_id"] and e["to"] == "running"]
    assert [(step, status) for status, step, *_ in bars] == entered  # one bar per phase
    start, end = record.created_at, record.finished_at
    assert end is not None
    span = (end - start).total_seconds()
    for _, step, began, ended, x, y, width in bars:
        began_at, ended_at = datetime.fromisoformat(began), datetime.fromisoformat(ended)
        expected = timeline.LABEL + (timeline.WIDTH - timeline.LABEL) * (
            (began_at - start).total_seconds() / span
        )
        assert abs(float(x) - expected) < 0.01
        length = (ended_at - began_at).total_seconds() / span * (timeline.WIDTH - timeline.LABEL)
        assert abs(float(width) - max(length, 1.0)) < 0.02
        assert int(y) == ["a", "b"].index(step) * timeline.ROW
        recorded = next(s for s in record.steps if s.step_id == step)
        assert ended_at == recorded.finished_at  # the phase ends when the step completed


def test_a_branching_step_has_a_row_and_a_bar_per_branch_run(settings: Settings) -> None:
    from tests.unit.test_branches import _research

    world = World(settings)
    run_id = world.launch(_research(), {"topics": ["ants", "bees"]})
    world.pump()
    record = world.record(run_id)
    assert record.status == "completed"
    drawn = timeline.build(record, world.orch.events(run_id, owner=OWNER), world.clock.now)
    assert drawn.steps == ["research", "  [0]", "  [1]", "summary"]
    branches = [phase for phase in drawn.phases if phase.row in (1, 2)]
    assert [(p.row, p.status) for p in branches] == [(1, "completed"), (2, "completed")]
    for phase, branch in zip(branches, record.steps[0].branches or [], strict=True):
        assert (phase.start, phase.end) == (branch["started_at"], branch["finished_at"])


def test_a_step_that_has_not_started_has_a_row_and_no_bar(settings: Settings) -> None:
    """CI caught a run page answering 500 for a run whose second step had no journal row."""
    world = World(settings)
    flow = {
        "name": "two",
        "steps": [
            step_spec("a", with_={"states": [["running", 1000]]}),
            step_spec("b", with_={"states": [["completed"]]}),
        ],
    }
    run_id = world.launch(flow)
    world.pump(rounds=2)
    record = world.record(run_id)
    assert [step.status for step in record.steps] == ["running", "pending"]
    drawn = timeline.build(record, world.orch.events(run_id, owner=OWNER), world.clock.now)
    assert drawn.steps == ["a", "b"]
    assert [(phase.step_id, phase.status) for phase in drawn.phases] == [("a", "running")]
    assert [row for row, *_ in drawn.countdowns] == [0]  # a's next poll
