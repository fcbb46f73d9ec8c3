"""Retention (issue 13, first part): ``orchestration prune`` deletes runs that ended before the
cutoff with every row they own, in bounded batches, and never a live run, a recent one, or a
branch run apart from its parent."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import ValidationError
from orchestration.core.models import Checkpoint, Run, RunEvent, Step
from orchestration.core.settings import Settings
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.surfaces.maintenance import age
from orchestration.upkeep import retention
from tests.unit.support import RecordingDispatcher, cli, insert_run
from tests.unit.test_branches import World, _research
from tests.unit.test_schedules import OWNER, T0, _fires, _pass, _register, _runs, _workflow


@pytest.fixture
def world(settings: Settings) -> World:
    return World(settings)


def _rows(settings: Settings) -> dict[str, int]:
    with session_scope(settings.database_url) as session:
        return {
            model.__tablename__: int(session.scalar(select(func.count()).select_from(model)) or 0)
            for model in (Run, Step, RunEvent, Checkpoint)
        }


def test_prune_deletes_old_runs_with_their_rows_and_branches_and_keeps_the_rest(
    world: World, settings: Settings
) -> None:
    old = world.launch(_research(), {"topics": ["a", "b", "c"]})
    world.pump()
    assert world.record(old).status == "completed"
    world.clock.advance(40 * 86400)
    recent = world.launch(_research(), {"topics": ["d"]})
    world.pump()
    live = insert_run(settings, "running", now=world.clock.now)
    before = _rows(settings)
    cutoff = world.clock.now - timedelta(days=30)
    executor = Executor(settings, None)
    counted = retention.prune(executor, cutoff=cutoff, dry_run=True)
    assert (counted["runs"], counted["branch_runs"]) == (1, 3)
    assert _rows(settings) == before  # a dry run deletes nothing
    report = retention.prune(executor, cutoff=cutoff, batch=1)
    assert (report["runs"], report["branch_runs"], report["batches"]) == (1, 3, 1)
    assert report["steps"] == counted["steps"] == 2 + 3  # the run's two steps, one per branch
    assert report["run_events"] == counted["run_events"] > 0
    after = _rows(settings)
    assert after["runs"] == before["runs"] - 4
    assert after["steps"] == before["steps"] - report["steps"]
    with session_scope(settings.database_url) as session:
        kept = set(session.scalars(select(Run.id).where(Run.parent_run_id.is_(None))))
    assert kept == {recent, live}
    assert retention.prune(executor, cutoff=cutoff)["runs"] == 0  # nothing left to do


def test_a_run_with_a_live_branch_is_kept(world: World, settings: Settings) -> None:
    flow = _research()
    flow["steps"][0]["step"]["with"] = {"states": [["running"]]}
    run_id = world.launch(flow, {"topics": ["a"]})
    world.pump(rounds=2)
    with session_scope(settings.database_url) as session:  # a parent whose branch outlived it
        run = session.get(Run, run_id)
        assert run is not None
        run.status, run.finished_at = "failed", world.clock.now
    cutoff = world.clock.now + timedelta(days=1)
    report = retention.prune(Executor(settings, None), cutoff=cutoff)
    assert report["runs"] == 0


def test_a_run_with_a_live_rerun_is_kept(world: World, settings: Settings) -> None:
    flow = _research()
    flow["steps"][1]["with"] = {"states": [["failed"]]}
    failed = world.launch(flow, {"topics": ["a"]})
    world.pump()
    assert world.record(failed).status == "failed"
    rerun = world.orch.rerun(failed, owner="owner-1")
    cutoff = world.clock.now + timedelta(days=1)
    executor = Executor(settings, None)
    assert retention.prune(executor, cutoff=cutoff)["runs"] == 0  # its rerun is live
    world.pump()
    assert world.record(rerun.id).status == "failed"
    assert retention.prune(executor, cutoff=cutoff + timedelta(days=1))["runs"] == 2


def test_prune_deletes_old_fires_but_each_schedules_latest_and_those_of_live_runs(
    settings: Settings,
) -> None:
    clock = [T0]
    orch = Orchestrator(settings, RecordingDispatcher(), clock=lambda: clock[0])

    def at(seconds: int) -> datetime:
        clock[0] = T0 + timedelta(seconds=seconds)
        return clock[0]

    _register(orch, _workflow(overlap="skip"))
    _register(orch, {**_workflow(overlap="skip"), "name": "weekly"}, at(5))
    _pass(orch, at(10))  # nightly and weekly: launched
    (first, weekly) = _runs(orch)
    orch.cancel(first.id, owner=OWNER)
    _pass(orch, at(20))  # nightly: launched; weekly: skipped, its run is live
    orch.cancel(weekly.id, owner=OWNER)
    _pass(orch, at(30))  # nightly: skipped (live run); weekly: launched
    _pass(orch, at(40))  # both skipped
    assert len(_fires(orch)) == 8
    executor = Executor(settings, None)
    cutoff = at(45)
    counted = retention.prune(executor, cutoff=cutoff, dry_run=True)
    report = retention.prune(executor, cutoff=cutoff, batch=1)
    # Gone: nightly's 10 (its run ended) and 30 (skipped), weekly's 10 (its run ended) and 20.
    # Kept: nightly's 20 and weekly's 30 (their runs are live), and both 40s (the cursors).
    assert report["schedule_fires"] == counted["schedule_fires"] == 4
    assert report["batches"] == 2 + 4  # the two cancelled runs, then a fire row each
    assert retention.prune(executor, cutoff=cutoff)["schedule_fires"] == 0
    assert [seconds for seconds, _, _ in _fires(orch)] == [20, 30, 40, 40]
    for run in _runs(orch):
        orch.cancel(run.id, owner=OWNER)
    assert retention.prune(executor, cutoff=cutoff)["schedule_fires"] == 2
    assert [(seconds, status) for seconds, status, _ in _fires(orch)] == [
        (40, "skipped"),
        (40, "skipped"),
    ]
    # The cursors survived: the next pass plans only the fires after them.
    report = _pass(orch, at(50))
    assert (report["launched"], report["skipped"]) == (2, 0)
    assert [seconds for seconds, _, _ in _fires(orch)] == [40, 40, 50, 50]


def test_an_age_is_a_number_and_a_unit() -> None:
    assert age("30d") == timedelta(days=30)
    assert age("12h") == timedelta(hours=12)
    assert age("90") == timedelta(seconds=90)
    for bad in ("0d", "-1d", "30 days", ""):
        with pytest.raises(ValidationError, match="older_than"):
            age(bad)


def test_the_prune_command_prints_its_report(settings: Settings) -> None:
    insert_run(settings, "completed", finished_at=utcnow() - timedelta(days=1))
    insert_run(settings, "completed", finished_at=utcnow() + timedelta(days=1))
    run = cli(settings)
    done = run("prune", "--older-than", "1s", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs"] == 1
    bad = run("prune", "--older-than", "soon")
    assert bad.returncode == 2 and "older_than" in bad.stderr


def test_beat_prunes_hourly_only_when_a_retention_is_set(settings: Settings) -> None:
    from beat_schedule import beat_schedule
    from orchestration.runtime.celery_config import PRUNE_TASK

    assert "orchestration-prune" not in beat_schedule(settings)
    entry = beat_schedule(settings.model_copy(update={"retention_days": 30.0}))[
        "orchestration-prune"
    ]
    assert (entry["task"], entry["schedule"]) == (PRUNE_TASK, 3600.0)
