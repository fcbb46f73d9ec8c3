"""The live-run counts a launch's admission reads (``orchestration.limits.live_counts``) are kept by
triggers on ``runs``: whatever writes a run, they equal a count of the live runs, branch runs
included (migration 0017)."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select, text

from orchestration.core.db import session_scope, upgrade
from orchestration.core.errors import LimitExceeded
from orchestration.core.models import LiveRunCount, Run
from orchestration.core.settings import Settings
from orchestration.core.states import RUN_LIVE
from orchestration.limits.live_counts import TOTAL
from orchestration.runtime.executor import Executor
from orchestration.upkeep import retention
from tests.unit.conftest import Databases
from tests.unit.support import (
    T0,
    RecordingDispatcher,
    insert_run,
    launch,
    step_spec,
    workflow,
)
from tests.unit.test_branches import OWNER, World, _research

RUNNING = {"states": [["running"]]}


def kept(settings: Settings) -> dict[str, int]:
    """The counts as the triggers kept them, by owner (``TOTAL`` for all), zeros left out."""
    with session_scope(settings.database_url) as session:
        rows = session.execute(
            select(LiveRunCount.owner, func.sum(LiveRunCount.live)).group_by(LiveRunCount.owner)
        ).all()
    return {owner: int(live) for owner, live in rows if live}


def counted(settings: Settings) -> dict[str, int]:
    """The live runs (branch runs included) counted from the rows, by owner and in all."""
    with session_scope(settings.database_url) as session:
        rows = session.execute(
            select(Run.owner, func.count())
            .where(Run.status.in_([s.value for s in RUN_LIVE]))
            .group_by(Run.owner)
        ).all()
    mine = {owner: int(live) for owner, live in rows}
    return {**mine, TOTAL: sum(mine.values())} if mine else {}


@pytest.fixture
def world(settings: Settings) -> World:
    return World(settings)


def test_the_counts_follow_every_way_a_run_becomes_and_stops_being_live(
    world: World, settings: Settings
) -> None:
    flow = _research()
    flow["steps"][0]["step"]["with"] = RUNNING
    fanned = world.launch(flow, {"topics": ["a", "b", "c"]})
    world.pump(rounds=3)
    with session_scope(settings.database_url) as session:
        branches = session.scalars(select(Run.status).where(Run.parent_run_id == fanned)).all()
    # Three live branch runs, counted with their parent.
    assert sorted(branches) == ["running"] * 3
    assert kept(settings) == counted(settings) == {OWNER: 4, TOTAL: 4}
    done = world.launch(workflow(step_spec(with_={"states": [["completed"]]})))
    other = [launch(settings, workflow(step_spec()), owner="other") for _ in range(2)]
    assert kept(settings) == counted(settings) == {OWNER: 5, "other": 2, TOTAL: 7}
    world.pump(rounds=3)
    assert world.record(done).status == "completed"
    world.orch.cancel(fanned, owner=OWNER)
    world.orch.cancel(other[0], owner="other")
    assert kept(settings) == counted(settings) == {"other": 1, TOTAL: 1}
    # Rows written straight through the ORM are counted too: the database keeps the counts.
    insert_run(settings, "running", owner="third")
    insert_run(settings, "failed", owner="third")
    assert kept(settings) == counted(settings) == {"other": 1, "third": 1, TOTAL: 2}
    # A prune deletes ended runs only: the counts stay.
    world.clock.advance(40 * 86400)
    report = retention.prune(Executor(settings, None), cutoff=world.clock.now - timedelta(1))
    assert report["runs"] >= 3
    assert kept(settings) == counted(settings) == {"other": 1, "third": 1, TOTAL: 2}
    with session_scope(settings.database_url) as session:
        session.execute(text("DELETE FROM runs WHERE owner = 'third'"))
    assert kept(settings) == counted(settings) == {"other": 1, TOTAL: 1}


def test_a_run_that_ends_gives_its_place_back_under_both_limits(settings: Settings) -> None:
    queue = RecordingDispatcher()
    for limits in ({"max_active_runs_per_owner": 1}, {"max_active_runs": 1}):
        limited = settings.model_copy(update=limits)
        first = launch(limited, workflow(step_spec()), dispatcher=queue)
        with pytest.raises(LimitExceeded, match="ORCH_MAX_ACTIVE_RUNS"):
            launch(limited, workflow(step_spec()), dispatcher=queue)
        World(limited).orch.cancel(first, owner="owner-1")
        again = launch(limited, workflow(step_spec()), dispatcher=queue)
        World(limited).orch.cancel(again, owner="owner-1")
    assert kept(settings) == counted(settings) == {}


def _insert_before_0015(settings: Settings, status: str, owner: str) -> None:
    """A run row as the schema before the journal's triggers holds it (no ``cause``)."""
    run_id = uuid.uuid4().hex
    with session_scope(settings.database_url) as session:
        session.execute(
            insert(Run.__table__).values(
                id=run_id,
                owner=owner,
                request_id=run_id,
                fingerprint="0" * 64,
                workflow_name="wf",
                workflow={},
                args={},
                status=status,
                created_at=T0,
                updated_at=T0,
                heartbeat_at=T0,
                task_ids=[],
                current_step=0,
                rearms=0,
                needs_review=False,
            )
        )


def test_runs_there_before_the_migration_are_counted(
    tmp_path: Path, unit_databases: Databases
) -> None:
    settings = unit_databases.blank(tmp_path, "t")
    upgrade(settings.database_url, "0013")
    for status in ("queued", "running", "parked", "completed", "cancelled"):
        _insert_before_0015(settings, status, "owner-1")
    _insert_before_0015(settings, "running", "other")
    upgrade(settings.database_url)
    assert kept(settings) == counted(settings) == {"owner-1": 3, "other": 1, TOTAL: 4}


#: The triggers on ``runs`` as each database writes them back, and how a list of statuses in
#: a trigger's condition reads there.
_TRIGGERS = {
    "sqlite": "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'runs'",
    "postgresql": "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
    "WHERE tgrelid = 'runs'::regclass AND NOT tgisinternal",
}
_STATUS_LISTS = {"sqlite": r"status (?:NOT )?IN \(([^)]*)\)", "postgresql": r"ARRAY\[([^\]]*)\]"}


def test_the_triggers_count_the_live_statuses_of_the_state_machine(settings: Settings) -> None:
    with session_scope(settings.database_url) as session:
        dialect = session.get_bind().dialect.name
        triggers = dict(session.execute(text(_TRIGGERS[dialect])).all())
    triggers = {name: sql for name, sql in triggers.items() if name.startswith("runs_live_")}
    assert set(triggers) == {"runs_live_inserted", "runs_live_ended", "runs_live_deleted"}
    live = {s.value for s in RUN_LIVE}
    for sql in triggers.values():
        lists = re.findall(_STATUS_LISTS[dialect], sql)
        assert lists, sql
        for listed in lists:
            assert set(re.findall(r"'(\w+)'", listed)) == live, sql
