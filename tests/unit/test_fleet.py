"""The operator's fleet page (issue 14, one part): workers seen from their step stamps, live
runs by health, the sweeper's last pass, runs started and ended, poll lateness and sweep time
per minute as server-drawn SVG bars; an operator's session only."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from orchestration.core.db import session_scope, utcnow
from orchestration.core.models import Step
from orchestration.core.settings import Settings
from orchestration.reads import fleet
from orchestration.runtime import broker_probe, poll_lateness
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.upkeep import fleet_series
from orchestration.upkeep.sweeper import SWEEPER_NAME, Sweeper
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
        settings,
        "completed",
        now=now - timedelta(minutes=30),
        finished_at=now - timedelta(minutes=2, seconds=30),
    )
    old = insert_run(settings, "completed", now=now - timedelta(hours=3))
    _stamp(settings, live, "w1@host", now - timedelta(seconds=20))
    _stamp(settings, ended, "w2@host", now - timedelta(minutes=3))
    _stamp(settings, old, "w3@host", now - timedelta(hours=2))
    Sweeper(settings, Executor(settings, None)).sweep(now)
    with session_scope(settings.database_url) as session:
        seen = fleet.snapshot(session, settings, now)
    assert [(w.name, w.active_steps, w.steps) for w in seen.workers] == [
        ("w1@host", 1, 1),
        ("w2@host", 0, 1),
    ]
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


def test_summaries_add_up_and_their_quantile_is_a_bucket_bound_at_most_the_largest() -> None:
    one = fleet_series.Summary.of([0.004, 0.2, 0.3])
    other = fleet_series.Summary.of([-0.5, 7.0])  # early by a clock's skew counts as 0
    one.merge(other)
    assert (one.count, round(one.total, 3), one.largest) == (5, 7.504, 7.0)
    assert one.quantile(0.5) == 0.25  # the third value of five (0.2) is in (0.1, 0.25]
    assert one.quantile(0.99) == 7.0  # the bucket (5, 10] cut to the largest seen
    assert fleet_series.Summary.of([0.003]).quantile(0.99) == 0.003
    assert fleet_series.Summary().quantile(0.99) == 0.0


def test_a_worker_writes_a_minute_of_poll_lateness_once_it_is_over(settings: Settings) -> None:
    executor = Executor(settings, None)
    recorder = poll_lateness.MinuteRecorder(executor, "host:1")
    start = fleet_series.minute_of(utcnow()) - timedelta(minutes=5)
    for second, late in ((1, 0.02), (30, 0.4), (59, 3.0)):
        recorder.observe(late, start + timedelta(seconds=second))
    with session_scope(settings.database_url) as session:
        assert session.scalars(select(fleet_series.FleetSample)).all() == []  # minute open
    recorder.observe(0.01, start + timedelta(minutes=1, seconds=2))  # the next minute
    recorder.flush()  # the process exits
    with session_scope(settings.database_url) as session:
        minutes = fleet_series.per_minute(session, fleet_series.Series.POLL_LATENESS, start, 3)
    first, second, third = minutes
    assert first is not None and (first.count, first.largest) == (3, 3.0)
    assert first.quantile(0.5) == 0.5 and first.quantile(0.99) == 3.0
    assert second is not None and second.count == 1
    assert third is None


def test_the_lateness_of_a_poll_is_read_from_celerys_eta_header() -> None:
    now = utcnow()
    assert poll_lateness.lateness((now - timedelta(seconds=2)).isoformat(), now) == 2.0
    assert poll_lateness.lateness(None, now) is None  # a chain's first delivery
    assert poll_lateness.lateness("not a time", now) is None


def test_every_sweep_pass_is_a_sample_and_old_samples_go(settings: Settings) -> None:
    now = utcnow()
    with session_scope(settings.database_url) as session:
        fleet_series.record(
            session,
            fleet_series.Series.POLL_LATENESS,
            "old:1",
            now - timedelta(hours=3),
            fleet_series.Summary.of([1.0]),
        )
    sweeper = Sweeper(settings, Executor(settings, None))
    this_minute = fleet_series.minute_of(now)
    sweeper.sweep(this_minute - timedelta(seconds=90))
    sweeper.sweep(this_minute - timedelta(seconds=30))
    with session_scope(settings.database_url) as session:
        rows = session.scalars(select(fleet_series.FleetSample)).all()
        assert sorted(row.series for row in rows) == ["sweep_seconds", "sweep_seconds"]
        seen = fleet.snapshot(session, settings, now)
    passes = [one for one in seen.sweep_seconds if one is not None]
    assert [one.count for one in passes] == [1, 1]
    assert seen.sweep_seconds[-1] is not None and seen.sweep_seconds[-2] is not None


def test_the_fleet_page_plots_poll_lateness_and_sweep_time(settings: Settings) -> None:
    now = utcnow()
    start = fleet_series.minute_of(now)
    with session_scope(settings.database_url) as session:
        for ago, late in ((2, [0.05, 0.2]), (10, [4.0])):
            fleet_series.record(
                session,
                fleet_series.Series.POLL_LATENESS,
                "w:1",
                start - timedelta(minutes=ago),
                fleet_series.Summary.of(late),
            )
        operator = tokens.create(session, None, "alice", now=now, operator=True)
    Sweeper(settings, Executor(settings, None)).sweep(now - timedelta(seconds=61))
    page = TestClient(
        create_app(Orchestrator(settings, None)), headers={"Authorization": f"Bearer {operator}"}
    ).get("/dashboard/fleet")
    late = re.search(r'<svg id="plot-poll-lateness".*?</svg>', page.text, re.S)
    assert late is not None
    titles = re.findall(r"<title>(.*?)</title>", late.group(0))
    assert titles == ["p99 4.00 s late, 10 min ago", "p99 200 ms late, 2 min ago"]
    heights = [float(h) for h in re.findall(r'class="bar"[^>]*height="([\d.]+)"', late.group(0))]
    assert heights == [80.0, 4.0]  # 0.2 s of 4 s, on an 80-unit plot
    assert "worst 4.00 s" in page.text
    sweep = re.search(r'<svg id="plot-sweep-time".*?</svg>', page.text, re.S)
    assert sweep is not None and sweep.group(0).count('class="bar"') == 1


def test_the_pool_broadcast_is_asked_once_per_freshness_window(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def ask(_: Settings) -> dict[str, dict[str, object]]:
        asked.append("broadcast")
        return {"w@host": {"pool": "prefork", "concurrency": 2}}

    monkeypatch.setattr(broker_probe, "ask_pools", ask)
    monkeypatch.setattr(broker_probe, "_asked", {})
    first, age = broker_probe.pools(settings)
    again, later = broker_probe.pools(settings)
    assert first == again and len(asked) == 1 and 0 <= age <= later < broker_probe.POOLS_FRESH
    monkeypatch.setattr(broker_probe, "POOLS_FRESH", 0.0)
    broker_probe.pools(settings)
    assert len(asked) == 2
