"""The live-turn counts admission reads (``owner_use.live_turns``) are kept by triggers on
``steps`` (migration 0024): whatever writes a step, they equal a count of the steps that are
``running`` with a turn or a start claimed, by their run's owner."""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import func, insert, select, text, update

from orchestration.core.db import session_scope, upgrade
from orchestration.core.models import LiveTurnCount, Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import StepStatus
from orchestration.limits import owner_budgets
from tests.unit.conftest import Databases
from tests.unit.support import T0, launch, step_spec, workflow
from tests.unit.test_branches import OWNER, World, _research

RUNNING = {"states": [["running"]]}


def kept(settings: Settings) -> dict[str, int]:
    """The counts as the triggers kept them, by owner, zeros left out."""
    with session_scope(settings.database_url) as session:
        rows = session.execute(
            select(LiveTurnCount.owner, func.sum(LiveTurnCount.live)).group_by(LiveTurnCount.owner)
        ).all()
    return {owner: int(live) for owner, live in rows if live}


def counted(settings: Settings) -> dict[str, int]:
    """The live turns counted from the rows, by owner."""
    with session_scope(settings.database_url) as session:
        rows = session.execute(
            select(Run.owner, func.count())
            .join(Step, Step.run_id == Run.id)
            .where(
                Step.status == StepStatus.RUNNING.value,
                (Step.provider_run_id.is_not(None)) | (Step.start_claimed_at.is_not(None)),
            )
            .group_by(Run.owner)
        ).all()
    return {owner: int(live) for owner, live in rows}


def test_the_counts_follow_every_way_a_step_becomes_and_stops_being_a_turn(
    settings: Settings,
) -> None:
    world = World(settings)
    flow = _research()
    flow["steps"][0]["step"]["with"] = RUNNING
    fanned = world.launch(flow, {"topics": ["a", "b", "c"]})
    waiting = world.launch(workflow(step_spec(with_=RUNNING)))
    world.pump(rounds=3)
    # Three branch runs' turns and one of a plain run; the parent's fan-out step has none.
    assert kept(settings) == counted(settings) == {OWNER: 4}
    done = world.launch(workflow(step_spec(with_={"states": [["completed"]]})))
    theirs = launch(settings, workflow(step_spec(with_=RUNNING)), owner="other")
    world.pump(rounds=3)
    assert world.record(done).status == "completed"
    assert kept(settings) == counted(settings) == {OWNER: 4}
    world.orch.cancel(fanned, owner=OWNER)
    world.pump(rounds=3)
    assert kept(settings) == counted(settings) == {OWNER: 1}
    with session_scope(settings.database_url) as session:
        used = {use.budget: use.used for use in owner_budgets.use(session, settings, OWNER)}
    assert used["owner_live_turns"] == 1
    # Rows written straight through SQL are counted too: the database keeps the counts.
    with session_scope(settings.database_url) as session:
        session.execute(
            update(Step)
            .where(Step.run_id == theirs)
            .values(status=StepStatus.RUNNING.value, start_claimed_at=T0)
        )
    assert kept(settings) == counted(settings) == {OWNER: 1, "other": 1}
    # A live run deleted takes its turns with it.
    with session_scope(settings.database_url) as session:
        session.execute(text("DELETE FROM runs WHERE id = :id"), {"id": waiting})
    assert kept(settings) == counted(settings) == {"other": 1}


#: The moves from ``pending`` to each status a seeded step ends in.
_MOVES = {"pending": [], "running": ["running"], "completed": ["running", "completed"]}


def _insert_before_0024(settings: Settings, owner: str, statuses: list[str]) -> None:
    """A running run and its steps, as the schema before 0024 holds them: written new, then
    moved (the status triggers admit only a new run's and a new step's first statuses)."""
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
                status="queued",
                cause="seeded",
                created_at=T0,
                updated_at=T0,
                heartbeat_at=T0,
                task_ids=[],
                current_step=0,
                rearms=0,
                needs_review=False,
            )
        )
        for index in range(len(statuses)):
            session.execute(
                insert(Step.__table__).values(
                    run_id=run_id,
                    index=index,
                    step_id=f"s{index}",
                    provider="scripted",
                    status="pending",
                    cause="seeded",
                    attempt=1,
                    polls=0,
                    created_at=T0,
                    updated_at=T0,
                )
            )
        session.execute(update(Run).where(Run.id == run_id).values(status="running"))
        for index, status in enumerate(statuses):
            for moved in _MOVES[status]:
                session.execute(
                    update(Step)
                    .where(Step.run_id == run_id, Step.index == index)
                    .values(status=moved, provider_run_id="turn")
                )


def test_turns_there_before_the_migration_are_counted(
    tmp_path: Path, unit_databases: Databases
) -> None:
    settings = unit_databases.blank(tmp_path, "t")
    upgrade(settings.database_url, "0023")
    _insert_before_0024(settings, "owner-1", ["completed", "running", "pending"])
    _insert_before_0024(settings, "owner-1", ["running"])
    _insert_before_0024(settings, "other", ["running", "pending"])
    upgrade(settings.database_url)
    assert kept(settings) == counted(settings) == {"owner-1": 2, "other": 1}


def test_a_run_deleted_in_the_transaction_that_started_its_turn_leaves_no_count(
    settings: Settings,
) -> None:
    run_id = launch(settings, workflow(step_spec(with_=RUNNING)))
    with session_scope(settings.database_url) as session:
        session.execute(
            update(Step)
            .where(Step.run_id == run_id)
            .values(status=StepStatus.RUNNING.value, start_claimed_at=T0)
        )
        session.execute(text("DELETE FROM runs WHERE id = :id"), {"id": run_id})
    assert kept(settings) == counted(settings) == {}
