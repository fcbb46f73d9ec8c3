"""The dashboard's run list (issue 33): top-level runs only, each with its branch count, read
in one statement; the branch runs are listed on their parent's page."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient

from orchestration.core.db import session_scope
from orchestration.core.settings import Settings
from orchestration.execution import Stepper
from orchestration.reads import summaries
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from tests.unit.support import T0, Clock, RecordingDispatcher, launch, step_spec, workflow
from tests.unit.test_execution_shape import counting

OWNER = "owner-1"
TOPICS = ["ants", "bees", "cats", "dogs", "eels"]


def _fan_out() -> dict[str, Any]:
    return {
        "name": "fan",
        "steps": [
            {
                "id": "research",
                "for_each": "{{ args.topics }}",
                "max_concurrency": 2,
                "step": step_spec("x", task="Research {{ item }}"),
            }
        ],
    }


def test_the_list_shows_top_level_runs_with_their_branch_counts_in_one_statement(
    settings: Settings,
) -> None:
    queue = RecordingDispatcher()
    clock = Clock(T0)
    fan = launch(settings, _fan_out(), {"topics": TOPICS}, now=T0, dispatcher=queue)
    # One execution of the for_each step makes the five branch runs (two admitted).
    stepper = Stepper(settings, Executor(settings, queue), clock=clock, worker="w", pid=1)
    stepper.advance(fan, 0, queue.chains[0].links[0].tick, chained=False)
    clock.advance(1)
    single = launch(settings, workflow(name="single"), now=clock.now, dispatcher=queue)
    orch = Orchestrator(settings, queue, clock=clock)
    parent = orch.get(fan, owner=OWNER)
    children = [branch["run_id"] for branch in parent.steps[0].branches or []]
    assert len(children) == len(TOPICS)
    assert {one.id for one in orch.list(owner=OWNER)} == {fan, single, *children}

    with counting(settings) as count, session_scope(settings.database_url) as session:
        listed = summaries.listing(
            session, settings, owner=OWNER, now=clock.now, limit=50, top_level=True
        )
    assert count.statements == ["SELECT"]
    assert [(one.id, getattr(one, "branches", None)) for one in listed] == [
        (single, 0),
        (fan, len(TOPICS)),
    ]

    with session_scope(settings.database_url) as session:
        token = tokens.create(session, OWNER, "t", now=clock.now)
    client = TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"})
    page = client.get("/dashboard").text
    assert re.findall(r'<tr data-run-id="(\w+)">', page) == [single, fan]
    assert f'<a class="branches muted" href="/dashboard/runs/{fan}#steps">5 branch runs</a>' in page
    # Filters keep to top-level runs too: the parked parent, not its queued branches.
    assert re.findall(
        r'<tr data-run-id="(\w+)">', client.get("/dashboard?health=waiting").text
    ) == [fan]
    own_page = client.get(f"/dashboard/runs/{fan}").text
    for child in children:
        assert f'href="/dashboard/runs/{child}"' in own_page
