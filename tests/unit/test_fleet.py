"""The operator's fleet page (issue 14, one part): workers seen from their step stamps, live
runs by health, the sweeper's last pass, runs started and ended per minute as server-drawn
SVG bars; an operator's session only."""

from __future__ import annotations

import re
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import update

from orchestration import fleet
from orchestration.db import session_scope, utcnow
from orchestration.models import Step
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.settings import Settings
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.sweeper import SWEEPER_NAME, Sweeper
from tests.unit.support import insert_run


def _stamp(settings: Settings, run_id: str, worker: str, at: object) -> None:
    with session_scope(settings.database_url) as session:
        session.execute(
            update(Step).where(Step.run_id == run_id).values(worker=worker, updated_at=at)
        )


def test_the_snapshot_counts_workers_health_and_runs_per_minute(settings: Settings) -> None:
    now = utcnow()
    live = insert_run(settings, "running", now=now - timedelta(seconds=2))
    ended = insert_run(
        settings, "completed", now=now - timedelta(minutes=30),
        finished_at=now - timedelta(minutes=2, seconds=30),
    )  # fmt: skip
    old = insert_run(settings, "completed", now=now - timedelta(hours=3))
    _stamp(settings, live, "w1@host", now - timedelta(seconds=20))
    _stamp(settings, ended, "w2@host", now - timedelta(minutes=3))
    _stamp(settings, old, "w3@host", now - timedelta(hours=2))
    Sweeper(settings, Executor(settings, None)).sweep(now)
    with session_scope(settings.database_url) as session:
        seen = fleet.snapshot(session, settings, now)
    assert [(w.name, w.active_steps, w.steps) for w in seen.workers] == [
        ("w1@host", 1, 1), ("w2@host", 0, 1),
    ]  # fmt: skip
    assert seen.health == {"working": 1}
    assert seen.past_deadline == 0
    assert (len(seen.started), sum(seen.started)) == (60, 2)  # the old run is out of the hour
    assert seen.started[-1] == 1 and seen.started[-30] == 1
    assert (sum(seen.ended), seen.ended[-3]) == (1, 1)
    assert [beat["name"] for beat in seen.sweepers] == [SWEEPER_NAME]


def test_the_fleet_page_is_the_operators_and_draws_a_bar_per_minute(
    settings: Settings,
) -> None:
    insert_run(settings, "running", now=utcnow() - timedelta(seconds=1))
    with session_scope(settings.database_url) as session:
        operator = tokens.create(session, None, "alice", now=utcnow(), operator=True)
        owner = tokens.create(session, "owner-1", "t", now=utcnow())
    app = create_app(Orchestrator(settings, None))
    page = TestClient(app, headers={"Authorization": f"Bearer {operator}"}).get("/dashboard/fleet")
    assert page.status_code == 200
    for plot in ("started", "ended"):
        svg = re.search(rf'<svg id="plot-{plot}".*?</svg>', page.text, re.S)
        assert svg is not None
        assert svg.group(0).count('class="bar"') == 60
    assert 'id="queue"' in page.text and "working" in page.text
    refused = TestClient(app, headers={"Authorization": f"Bearer {owner}"}).get("/dashboard/fleet")
    assert refused.status_code == 403
    anonymous = TestClient(app, follow_redirects=False).get("/dashboard/fleet")
    assert (anonymous.status_code, anonymous.headers["location"]) == (303, "/dashboard/login")
