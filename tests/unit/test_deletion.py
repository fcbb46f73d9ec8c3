"""Deleting a run (issue 32): an owner deletes one ended run with its branch runs, journal and
the artifacts nothing else references; a live run, a branch run or a run still cleaning up
is refused saying why, another owner's is not found, and the deletion is recorded for
operators. The operator's prune deletes through the same pieces."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Table, create_engine, func, inspect, select

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import ConflictError, RunNotFound
from orchestration.core.models import (
    Artifact,
    Checkpoint,
    Effect,
    PrunedRuns,
    Run,
    RunDeletion,
    RunEvent,
    Step,
)
from orchestration.core.settings import Settings
from orchestration.runs import artifacts, deletion
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.upkeep import retention
from tests.unit.support import cli, force, force_step, insert_run, snapshot
from tests.unit.test_artifacts import BIG, INLINE, _flow
from tests.unit.test_branches import OWNER, World, _research


@pytest.fixture
def world(settings_factory: Callable[..., Settings]) -> World:
    return World(settings_factory(inline_output_bytes=INLINE))


def _delete(world: World, run_id: str, owner: str = OWNER) -> deletion.Deletion:
    return retention.delete_run(
        world.executor, world.settings, run_id, owner=owner, by="test", now=world.clock.now
    )


def _ended(world: World, status: str) -> str:
    return insert_run(
        world.settings, status, now=world.clock.now, owner=OWNER, finished_at=world.clock.now
    )


def _count(settings: Settings, model: Any, *where: Any) -> int:
    with session_scope(settings.database_url) as session:
        return int(session.scalar(select(func.count()).select_from(model).where(*where)) or 0)


def _family(settings: Settings, run_id: str) -> list[str]:
    with session_scope(settings.database_url) as session:
        return list(
            session.scalars(
                select(Run.id).where((Run.id == run_id) | (Run.parent_run_id == run_id))
            )
        )


def test_an_owner_deletes_an_ended_run_with_its_branches_and_the_rest_stays(world: World) -> None:
    run_id = world.launch(_research(), {"topics": ["a", "b", "c"]})
    kept = world.launch(_research(), {"topics": ["d"]})
    world.pump()
    assert world.record(run_id).status == "completed"
    family = _family(world.settings, run_id)
    assert len(family) == 4
    before = {model: _count(world.settings, model) for model in (Run, Step, RunEvent, Checkpoint)}
    kept_before = snapshot(world.settings, kept)

    done = _delete(world, run_id)

    counts = done.deleted.counts
    assert (done.status, done.workflow, counts["runs"], counts["branch_runs"]) == (
        "completed",
        "research",
        1,
        3,
    )
    for model in (Step, RunEvent, Checkpoint):
        assert _count(world.settings, model, model.run_id.in_(family)) == 0
        assert _count(world.settings, model) == before[model] - counts[model.__tablename__]
    assert _count(world.settings, Run) == before[Run] - 4
    assert snapshot(world.settings, kept) == kept_before
    with pytest.raises(RunNotFound):
        world.record(run_id)
    with session_scope(world.settings.database_url) as session:
        (audit,) = session.scalars(select(RunDeletion)).all()
        assert (audit.run_id, audit.owner, audit.workflow, audit.status, audit.by) == (
            run_id,
            OWNER,
            "research",
            "completed",
            "test",
        )
        assert audit.branch_runs == 3
        # /metrics totals never go down: the four runs are counted as deleted ones.
        assert session.scalar(select(func.sum(PrunedRuns.count))) == 4
    with pytest.raises(RunNotFound):  # a second delete (a retry, a race) finds nothing
        _delete(world, run_id)
    assert _count(world.settings, RunDeletion) == 1


def test_another_owners_run_is_not_found_and_nothing_is_written(world: World) -> None:
    run_id = world.launch(_research(), {"topics": ["a"]})
    world.pump()
    before = snapshot(world.settings, run_id)
    with pytest.raises(RunNotFound) as raised:
        _delete(world, run_id, owner="someone-else")
    assert str(raised.value) == f"no run {run_id!r} for this owner"
    assert snapshot(world.settings, run_id) == before
    assert _count(world.settings, RunDeletion) == 0


def test_a_live_run_is_refused_saying_to_cancel_it_first(world: World) -> None:
    run_id = insert_run(world.settings, "running", now=world.clock.now, owner=OWNER)
    before = snapshot(world.settings, run_id)
    with pytest.raises(ConflictError, match="only an ended run can be deleted; cancel it first"):
        _delete(world, run_id)
    assert snapshot(world.settings, run_id) == before
    world.orch.cancel(run_id, owner=OWNER)
    assert _delete(world, run_id).status == "cancelled"


def test_a_branch_run_is_refused_naming_its_parent(world: World) -> None:
    run_id = world.launch(_research(), {"topics": ["a"]})
    world.pump()
    (branch,) = set(_family(world.settings, run_id)) - {run_id}
    with pytest.raises(ConflictError, match=f"is a branch of run {run_id}: delete run {run_id}"):
        _delete(world, branch)


def test_a_run_whose_branch_is_still_live_is_still_cleaning_up(world: World) -> None:
    flow = _research()
    flow["steps"][0]["step"]["with"] = {"states": [["running"]]}
    run_id = world.launch(flow, {"topics": ["a"]})
    world.pump(rounds=2)
    force(world.settings, run_id, status="failed", finished_at=world.clock.now)
    with pytest.raises(ConflictError, match=r"still cleaning up: its branch run \w+ is running"):
        _delete(world, run_id)
    (branch,) = set(_family(world.settings, run_id)) - {run_id}
    with pytest.raises(ConflictError, match=f"is a branch of run {run_id}"):  # live, too
        _delete(world, branch)
    assert len(_family(world.settings, run_id)) == 2


def test_a_turn_stop_not_yet_confirmed_holds_the_run_until_the_stop_tasks_budget(
    world: World,
) -> None:
    run_id = _ended(world, "failed")
    at = world.clock.now.isoformat()
    force_step(world.settings, run_id, 0, turn_stop={"status": "pending", "attempts": 1, "at": at})
    with pytest.raises(ConflictError, match="the stop of step s0's provider turn is not confirmed"):
        _delete(world, run_id)
    force_step(world.settings, run_id, 0, turn_stop={"status": "stopped", "attempts": 2, "at": at})
    assert _delete(world, run_id).status == "failed"
    # A stop left pending past the stop task's whole budget is no longer being tried.
    stale = _ended(world, "failed")
    force_step(world.settings, stale, 0, turn_stop={"status": "pending", "attempts": 1, "at": at})
    world.clock.advance(deletion.stop_budget(world.settings).total_seconds() + 1)
    assert _delete(world, stale).run_id == stale


def test_a_start_in_flight_and_an_effect_attempt_in_flight_hold_the_run(world: World) -> None:
    run_id = _ended(world, "cancelled")
    force_step(world.settings, run_id, 0, start_claimed_at=world.clock.now)
    with pytest.raises(ConflictError, match="a provider start of step s0 is still in flight"):
        _delete(world, run_id)
    force_step(world.settings, run_id, 0, start_claimed_at=None)
    with session_scope(world.settings.database_url) as session:
        now = world.clock.now
        session.add(
            Effect(
                run_id=run_id,
                step_index=0,
                attempt=1,
                kind="webhook",
                status="pending",
                attempts=1,
                max_attempts=5,
                next_attempt_at=now,
                created_at=now,
                updated_at=now,
            )
        )
    with pytest.raises(ConflictError, match="its webhook effect may still be running"):
        _delete(world, run_id)
    # Left pending by a run that ended, it is never attempted again: the run may go.
    world.clock.advance(world.settings.provider_timeout + 60)
    assert _delete(world, run_id).run_id == run_id
    assert _count(world.settings, Effect) == 0


def test_an_artifact_another_run_references_stays_and_an_unreferenced_one_goes(
    world: World,
) -> None:
    shared = world.launch(_flow(), {"text": BIG})
    alone = world.launch(_flow(), {"text": BIG + "!"})
    world.pump()
    # The same bytes stored by another owner are another row: never touched.
    other = world.orch.launch(_flow(), {"text": BIG + "!"}, owner="other-owner")
    world.pump()
    assert world.orch.get(other.id, owner="other-owner").status == "completed"
    twin = world.launch(_flow(), {"text": BIG})
    world.pump()
    assert _delete(world, shared).artifacts == 0  # the twin references it
    done = _delete(world, alone)
    assert done.artifacts == 1
    with session_scope(world.settings.database_url) as session:
        remaining = {tuple(row) for row in session.execute(select(Artifact.owner, Artifact.sha256))}
    assert remaining == {
        (OWNER, hashlib.sha256(BIG.encode()).hexdigest()),
        ("other-owner", hashlib.sha256((BIG + "!").encode()).hexdigest()),
    }
    assert world.record(twin).steps[0].output_artifact is not None


def test_a_file_in_the_artifact_folder_goes_once_no_row_names_it(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> None:
    folder = tmp_path / "artifacts"
    world = World(settings_factory(inline_output_bytes=INLINE, artifact_dir=str(folder)))
    run_id = world.launch(_flow(), {"text": BIG})
    world.pump()
    path = artifacts.file_path(folder, hashlib.sha256(BIG.encode()).hexdigest())
    assert path.exists()
    assert _delete(world, run_id).artifacts == 1
    assert not path.exists()


def test_prune_still_deletes_through_the_shared_pieces(world: World) -> None:
    run_id = world.launch(_research(), {"topics": ["a", "b"]})
    world.pump()
    world.clock.advance(40 * 86400)
    report = retention.prune(world.executor, cutoff=world.clock.now - timedelta(days=30))
    assert (report["runs"], report["branch_runs"]) == (1, 2)
    assert _family(world.settings, run_id) == []
    assert _count(world.settings, RunDeletion) == 0  # a prune is not an owner's deletion


def _token(settings: Settings, owner: str | None, name: str, *, operator: bool = False) -> str:
    with session_scope(settings.database_url) as session:
        return tokens.create(session, owner, name, now=utcnow(), operator=operator)


def test_the_api_deletes_refuses_with_409_and_404_and_operators_read_the_audit(
    world: World,
) -> None:
    run_id = world.launch(_research(), {"topics": ["a"]})
    world.pump()
    live = insert_run(world.settings, "running", now=world.clock.now, owner=OWNER)
    app = create_app(world.orch)
    owner = TestClient(
        app, headers={"Authorization": f"Bearer {_token(world.settings, OWNER, 'o')}"}
    )
    stranger = TestClient(
        app, headers={"Authorization": f"Bearer {_token(world.settings, 'x', 'x')}"}
    )
    operator = TestClient(
        app,
        headers={"Authorization": f"Bearer {_token(world.settings, None, 'ops', operator=True)}"},
    )
    assert stranger.delete(f"/runs/{run_id}").status_code == 404
    refused = owner.delete(f"/runs/{live}")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "conflict"
    assert "cancel it first" in refused.json()["error"]["message"]
    deleted = owner.delete(f"/runs/{run_id}")
    assert deleted.status_code == 200
    body = deleted.json()
    assert (body["run_id"], body["status"], body["branch_runs"], body["by"]) == (
        run_id,
        "completed",
        1,
        "api",
    )
    assert owner.get(f"/runs/{run_id}").status_code == 404
    assert owner.delete(f"/runs/{run_id}").status_code == 404
    assert owner.get("/operator/deletions").status_code == 403
    audit = operator.get("/operator/deletions").json()
    assert [(row["run_id"], row["owner"], row["workflow"]) for row in audit] == [
        (run_id, OWNER, "research")
    ]
    assert operator.get("/operator/deletions", params={"owner": "x"}).json() == []


def test_the_cli_deletes_and_lists_deletions(world: World) -> None:
    run_id = world.launch(_research(), {"topics": ["a"]})
    world.pump()
    live = insert_run(world.settings, "running", now=world.clock.now, owner=OWNER)
    run = cli(world.settings, OWNER)
    refused = run("delete", live)
    assert refused.returncode == 2
    assert f"run {live} is running: only an ended run can be deleted" in refused.stderr
    assert run("delete", run_id, "--owner", "x").returncode == 2
    done = run("delete", run_id)
    assert done.returncode == 0, done.stderr
    assert f"deleted run {run_id} (research, completed): 1 branch runs" in done.stdout
    listed = run("deletions", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["run_id"], row["owner"], row["status"]) == (run_id, OWNER, "completed")
    assert row["by"].startswith("cli (")


def test_the_migration_creates_the_audit_table_the_model_describes(settings: Settings) -> None:
    engine = create_engine(settings.database_url)
    try:
        found = inspect(engine)
        columns = {
            column["name"]: column["nullable"] for column in found.get_columns("run_deletions")
        }
        indexes = {index["name"] for index in found.get_indexes("run_deletions")}
    finally:
        engine.dispose()
    table = cast(Table, RunDeletion.__table__)
    assert columns == {column.name: column.nullable for column in table.columns}
    assert indexes == {index.name for index in table.indexes}
