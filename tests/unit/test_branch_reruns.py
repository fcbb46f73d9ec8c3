"""Reruns of a run whose branching step did not complete (issue 13): the branches that
completed in the source (same position, key, definition, item and rendered input) are
reused without starting their turns, the others run, and the join sees every output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestration.core.settings import Settings
from orchestration.execution import Stepper
from orchestration.providers.scripted import ScriptedProvider
from tests.unit.support import force_step, step_spec
from tests.unit.test_branches import OWNER, Forgetful, World


@pytest.fixture
def world(settings: Settings) -> World:
    return World(settings)


def _drafts(last: dict[str, Any] | None = None) -> dict[str, Any]:
    """Three parallel drafts, ``b`` slower than the others, then a summary of them."""
    now, slow = {"states": [["completed"]]}, {"states": [["running", 0.4], ["completed"]]}
    return {
        "name": "drafts",
        "steps": [
            {
                "id": "drafts",
                "parallel": {
                    "steps": [
                        step_spec("a", task="draft a", with_=now),
                        step_spec("b", task="draft b", with_=slow),
                        step_spec("c", task="draft c", with_=now),
                    ]
                },
            },
            step_spec("summary", task="{{ steps.drafts.output }}", with_=last),
        ],
    }


def _until(world: World, done: Callable[[], bool]) -> None:
    for _ in range(100):
        world.pump(rounds=1)
        if done():
            return
    pytest.fail("the runs never got there")


def _branches(world: World, run_id: str) -> list[dict[str, Any]]:
    return list(world.record(run_id).steps[0].branches or [])


def _starts(settings: Settings, run_id: str) -> int:
    return len(ScriptedProvider(settings).start_calls(f"{run_id}:"))


def _cancelled_midway(world: World) -> str:
    """A run cancelled while branch ``b`` still runs and ``a`` and ``c`` have completed."""
    run_id = world.launch(_drafts())
    _until(
        world,
        lambda: (
            [b["status"] for b in _branches(world, run_id)] == ["completed", "running", "completed"]
        ),
    )
    world.orch.cancel(run_id, owner=OWNER)
    statuses = [b["status"] for b in _branches(world, run_id)]
    assert statuses == ["completed", "cancelled", "completed"]
    return run_id


def test_a_rerun_runs_only_the_branches_that_did_not_complete_and_joins_every_output(
    world: World, settings: Settings
) -> None:
    source = _cancelled_midway(world)
    before = {b["id"]: b["run_id"] for b in _branches(world, source)}
    rerun = world.orch.rerun(source, owner=OWNER, request_id="again")
    assert rerun.current_step == 0
    world.pump()
    done = world.record(rerun.id)
    assert done.status == "completed"
    assert done.steps[0].output == {"a": "draft a", "b": "draft b", "c": "draft c"}
    branches = {b["id"]: b for b in done.steps[0].branches}
    assert {b["status"] for b in branches.values()} == {"completed"}
    # One turn for b; none for the branches reused, nor a second one for anything.
    turns = {key: _starts(settings, b["run_id"]) for key, b in branches.items()}
    assert turns == {"a": 0, "b": 1, "c": 0}
    reused = world.record(branches["a"]["run_id"])
    assert (reused.parent_run_id, reused.steps[0].input) == (rerun.id, "draft a")
    causes = [e["cause"] for e in world.orch.events(branches["a"]["run_id"], owner=OWNER)]
    came_from = f"output reused from branch run {before['a']} of run {source}"
    assert any(came_from in cause for cause in causes), causes
    said = [e["cause"] for e in world.orch.events(rerun.id, owner=OWNER)]
    assert f"3 branches starting; 2 reused from run {source}" in said
    assert world.orch.rerun(source, owner=OWNER, request_id="again").id == rerun.id


def test_a_branch_whose_input_differs_from_the_source_runs_again(
    world: World, settings: Settings
) -> None:
    source = _cancelled_midway(world)
    branch_c = _branches(world, source)[2]["run_id"]
    force_step(settings, branch_c, 0, input="draft c, as another step once rendered it")
    rerun = world.orch.rerun(source, owner=OWNER)
    world.pump()
    branches = {b["id"]: b["run_id"] for b in _branches(world, rerun.id)}
    assert {key: _starts(settings, run_id) for key, run_id in branches.items()} == {
        "a": 0,
        "b": 1,
        "c": 1,
    }
    assert world.record(rerun.id).status == "completed"


def test_for_each_reuses_by_item_index_and_admits_only_the_branches_that_run(
    world: World, settings: Settings
) -> None:
    flow = {
        "name": "topics",
        "steps": [
            {
                "id": "research",
                "for_each": "{{ args.topics }}",
                "max_concurrency": 1,
                "step": step_spec(
                    "one",
                    task="Research {{ item }}",
                    poll_interval=0.1,
                    with_={"states": [["running", 0.2], ["completed"]]},
                ),
            }
        ],
    }
    source = world.launch(flow, {"topics": ["ants", "bees", "cats"]})
    _until(world, lambda: [b["status"] for b in _branches(world, source)][:1] == ["completed"])
    world.orch.cancel(source, owner=OWNER)
    rerun = world.orch.rerun(source, owner=OWNER)
    world.pump(rounds=1)
    claims = [world.record(b["run_id"]).concurrency for b in _branches(world, rerun.id)]
    assert claims == [None, None, "slot"]  # the reused one holds no slot; one runs, one waits
    world.pump()
    done = world.record(rerun.id)
    assert done.result == ["Research ants", "Research bees", "Research cats"]
    assert [_starts(settings, b["run_id"]) for b in done.steps[0].branches] == [0, 1, 1]


def test_a_branching_step_that_completed_is_reused_whole_or_run_whole_when_named(
    world: World, settings: Settings
) -> None:
    source = world.launch(_drafts(last={"states": [["failed"]], "error": "flaky"}))
    world.pump()
    assert world.record(source).status == "failed"
    from_failure = world.orch.rerun(source, owner=OWNER)
    assert [s.status for s in from_failure.steps] == ["completed", "pending"]
    world.pump()
    assert _branches(world, from_failure.id) == []  # the step's output was reused, not its branches
    named = world.orch.rerun(source, owner=OWNER, from_step="drafts")
    world.pump()
    assert [_starts(settings, b["run_id"]) for b in _branches(world, named.id)] == [1, 1, 1]


def test_a_rerun_whose_branches_all_completed_joins_them_without_waiting(
    world: World, settings: Settings
) -> None:
    world.stepper = Stepper(settings, Forgetful(settings, world.queue), clock=world.clock)
    flow = _drafts()
    flow["steps"][0]["parallel"]["steps"].pop(1)  # a and c only, both quick
    source = world.launch(flow)
    world.pump()
    assert [b["status"] for b in _branches(world, source)] == ["completed", "completed"]
    world.orch.cancel(source, owner=OWNER)  # its join's hand-off was lost: it never joined
    world.stepper = Stepper(settings, world.executor, clock=world.clock)
    rerun = world.orch.rerun(source, owner=OWNER)
    world.pump()
    done = world.record(rerun.id)
    assert (done.status, done.steps[0].output) == ("completed", {"a": "draft a", "c": "draft c"})
    assert [_starts(settings, b["run_id"]) for b in done.steps[0].branches] == [0, 0]
    journal = world.orch.events(rerun.id, owner=OWNER)
    assert "parked" not in [e["to"] for e in journal]  # nothing to wait for
