"""Reruns (issue 13, first part): a new run of an ended run reuses the outputs of the steps
before the failed (or named) step without starting their turns, runs the rest, is linked both
ways, is idempotent per request id and owner-scoped, and a live or completed run is refused."""

from __future__ import annotations

from typing import Any

import pytest

from orchestration.core.errors import (
    ConflictError,
    IdempotencyConflict,
    RunNotFound,
    ValidationError,
)
from orchestration.core.settings import Settings
from orchestration.providers.scripted import ScriptedProvider
from tests.unit.support import step_spec
from tests.unit.test_branches import OWNER, World


@pytest.fixture
def world(settings: Settings) -> World:
    return World(settings)


def _flow(third: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "three",
        "steps": [
            step_spec("s1", task="one", with_={"states": [["completed"]]}),
            step_spec("s2", task="{{ steps.s1.output }} two", with_={"states": [["completed"]]}),
            step_spec("s3", task="{{ steps.s2.output }} three", with_=third),
        ],
    }


def _failed(world: World) -> str:
    run_id = world.launch(_flow({"states": [["failed"]], "error": "flaky"}))
    world.pump()
    assert world.record(run_id).status == "failed"
    return run_id


def test_a_rerun_reuses_the_completed_steps_and_runs_from_the_failed_one(
    world: World, settings: Settings
) -> None:
    failed = _failed(world)
    rerun = world.orch.rerun(failed, owner=OWNER, request_id="again")
    assert rerun.rerun_of == failed and rerun.current_step == 2
    assert [s.status for s in rerun.steps] == ["completed", "completed", "pending"]
    assert [s.output for s in rerun.steps[:2]] == ["one", "one two"]
    world.pump()
    done = world.record(rerun.id)
    assert (done.status, done.steps[2].input) == ("failed", "one two three")  # s3 fails again
    keys = [c["key"] for c in ScriptedProvider(settings).start_calls(f"{rerun.id}:")]
    assert keys == [f"{rerun.id}:s3:1"]  # s1 and s2 started no turn
    assert world.record(failed).reruns == [rerun.id]
    events = [(e["step_id"], e["cause"]) for e in world.orch.events(rerun.id, owner=OWNER)]
    assert ("s1", f"output reused from run {failed}") in events
    # Idempotent per request id; the same id for another rerun is a conflict.
    assert world.orch.rerun(failed, owner=OWNER, request_id="again").id == rerun.id
    with pytest.raises(IdempotencyConflict):
        world.orch.rerun(failed, owner=OWNER, request_id="again", from_step="s2")


def test_a_rerun_from_a_named_step_runs_it_and_what_follows(world: World) -> None:
    failed = _failed(world)
    rerun = world.orch.rerun(failed, owner=OWNER, from_step="s2")
    assert [s.status for s in rerun.steps] == ["completed", "pending", "pending"]


def test_what_cannot_be_rerun_is_refused_clearly_and_writes_nothing(world: World) -> None:
    failed = _failed(world)
    with pytest.raises(ValidationError, match="has no step 'nope'"):
        world.orch.rerun(failed, owner=OWNER, from_step="nope")
    with pytest.raises(RunNotFound):
        world.orch.rerun(failed, owner="someone-else")
    done = world.launch(_flow({"states": [["completed"]]}))
    world.pump()
    with pytest.raises(ConflictError, match="is completed"):
        world.orch.rerun(done, owner=OWNER)
    flow = _flow({"states": [["completed"]]})
    flow["steps"][1]["with"] = {"states": [["running"]]}
    live = world.launch(flow)
    with pytest.raises(ConflictError, match="is queued"):
        world.orch.rerun(live, owner=OWNER)
    world.pump(rounds=3)
    cancelled = world.orch.cancel(live, owner=OWNER)
    assert [s.status for s in cancelled.steps] == ["completed", "cancelled", "cancelled"]
    with pytest.raises(ValidationError, match="step 's2' before 's3' did not complete"):
        world.orch.rerun(live, owner=OWNER, from_step="s3")
    assert world.record(failed).reruns == world.record(live).reruns == []
    assert world.orch.rerun(live, owner=OWNER).current_step == 1  # from the cancelled step
