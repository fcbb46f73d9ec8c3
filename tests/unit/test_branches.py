"""Branching steps (issue 12): ``for_each`` and ``parallel`` run branch runs, admitted as
slots free and joined in the database; ``join: all`` fails fast, ``all_settled`` waits.

The worker is played in-process: every chain segment the executor hands to the queue is run
link by link by a real :class:`Stepper`, in the order it was sent (a recording queue stands in
for the broker; the real worker and beat are in ``tests/integration/test_branches.py``).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from orchestration.core import deadlines
from orchestration.core.errors import LimitExceeded, ValidationError
from orchestration.core.followups import ChainPlan, Followups
from orchestration.core.settings import Settings
from orchestration.execution import Halt, Poll, Proceed, Stepper
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.upkeep.sweeper import Sweeper
from orchestration.workflows.parsing import parse
from tests.unit.support import T0, Clock, RecordingDispatcher, launch, run_row, step_spec

OWNER = "owner-1"


def _done(states: list[Any] | None = None, **options: Any) -> dict[str, Any]:
    return {"states": states or [["completed"]], **options}


def _research(**step: Any) -> dict[str, Any]:
    return {
        "name": "research",
        "steps": [
            {
                "id": "research",
                "for_each": "{{ args.topics }}",
                **step,
                "step": {
                    "provider": "scripted",
                    "task": "Research {{ item }} ({{ index }})",
                    "poll_interval": 0.1,
                    "max_poll_interval": 1.0,
                    "with": _done(),
                },
            },
            step_spec("summary", task="{{ steps.research.output }}", with_=_done()),
        ],
    }


def _drafts(join: str = "all", long: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": "drafts",
        "steps": [
            {
                "id": "drafts",
                "parallel": {
                    "join": join,
                    "steps": [
                        step_spec("short", task="short", with_=_done()),
                        step_spec("long", task="long", with_=long or _done()),
                        step_spec("never", task="never", with_=_done([["running"]])),
                    ],
                },
            }
        ],
    }


class World:
    """One database, a recording queue and an in-process worker that plays what it records."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.clock = Clock(T0)
        self.queue = RecordingDispatcher()
        self.executor = Executor(settings, self.queue)
        self.stepper = Stepper(settings, self.executor, clock=self.clock, worker="w", pid=1)
        self.orch = Orchestrator(settings, self.queue, clock=self.clock)
        self.sent = 0
        self.polling: list[tuple[ChainPlan, int, int]] = []
        self.played: list[tuple[str, Any]] = []

    def launch(self, flow: dict[str, Any], args: dict[str, Any] | None = None) -> str:
        return launch(self.settings, flow, args, now=self.clock.now, dispatcher=self.queue)

    def pump(self, rounds: int | None = None) -> None:
        """Run every segment sent so far (and those they send) link by link, as the chain
        would: a link that proceeds hands on to the next. A polling step is polled once per
        round, so concurrent branches interleave. Without ``rounds``, until nothing polls."""
        for _ in range(rounds or 200):
            while self.sent < len(self.queue.chains):
                plan = self.queue.chains[self.sent]
                self.sent += 1
                self.polling.append((plan, 0, plan.links[0].tick))
            if not self.polling:
                return
            now_polling, self.polling = self.polling, []
            for plan, position, tick in now_polling:
                link = plan.links[position]
                chained = position + 1 < len(plan.links)
                outcome = self.stepper.advance(plan.run_id, link.index, tick, chained=chained)
                self.played.append((plan.run_id, outcome))
                if isinstance(outcome, Poll):
                    self.polling.append((plan, position, outcome.tick))
                elif isinstance(outcome, Proceed) and chained:
                    self.polling.append((plan, position + 1, plan.links[position + 1].tick))
            self.clock.advance(0.2)
            time.sleep(0.01)  # the scripted provider plays its states on the real clock
        if rounds is None:
            pytest.fail(f"still polling after 200 rounds: {self.polling}")

    def record(self, run_id: str) -> Any:
        return self.orch.get(run_id, owner=OWNER)


@pytest.fixture
def world(settings: Settings) -> World:
    return World(settings)


def test_for_each_runs_a_branch_per_item_and_joins_their_outputs_in_item_order(
    world: World,
) -> None:
    run_id = world.launch(_research(), {"topics": ["ants", "bees", "cats"]})
    world.pump()
    record = world.record(run_id)
    assert record.status == "completed"
    research, summary = record.steps
    assert research.output == ["Research ants (0)", "Research bees (1)", "Research cats (2)"]
    assert summary.output == research.output
    assert [b["id"] for b in research.branches] == ["0", "1", "2"]
    assert {b["status"] for b in research.branches} == {"completed"}
    branch = world.record(research.branches[1]["run_id"])
    assert (branch.parent_run_id, branch.parent_step, branch.branch) == (run_id, 0, 1)
    assert branch.steps[0].input == "Research bees (1)"


def test_max_concurrency_admits_branches_only_as_slots_free(world: World) -> None:
    flow = _research(max_concurrency=2)
    flow["steps"][0]["step"]["with"] = _done([["running", 0.5], ["completed"]])
    run_id = world.launch(flow, {"topics": ["a", "b", "c", "d", "e"]})
    world.pump(rounds=1)
    record = world.record(run_id)
    assert (record.status, record.park_reason) == ("parked", "branches")
    claims = [world.record(b["run_id"]).concurrency for b in record.steps[0].branches]
    assert claims == [None, None, "slot", "slot", "slot"]
    waiting = {summary.id for summary in world.orch.list(owner=OWNER, health="waiting")}
    slots = {b["run_id"] for b in record.steps[0].branches[2:]}
    assert slots | {run_id} <= waiting  # the parent and the branches waiting for a slot
    said = world.orch.explain(record.steps[0].branches[2]["run_id"], owner=OWNER)
    assert "waits for a slot of its step's max_concurrency" in said["why"]
    assert len(world.queue.chains) == 1 + 2  # the run's own segment, two branches
    world.pump()
    assert world.record(run_id).status == "completed"
    # Each admission followed an end: three more branches, then the summary's segment.
    assert len(world.queue.chains) == 1 + 2 + 3 + 1


def test_join_all_fails_fast_and_cancels_the_siblings_turns(world: World) -> None:
    run_id = world.launch(_drafts(long=_done([["failed"]], error="model refused")))
    world.pump(rounds=3)
    record = world.record(run_id)
    assert (record.status, record.stop_reason) == ("failed", "step_failed")
    assert "branch long" in (record.error or "") and "model refused" in (record.error or "")
    by_id = {b["id"]: b for b in record.steps[0].branches}
    assert by_id["long"]["status"] == "failed"
    assert by_id["short"]["status"] == "completed"
    never = world.record(by_id["never"]["run_id"])
    assert (never.status, never.stop_reason) == ("cancelled", "parent_ended")
    assert never.steps[0].turn_stop["status"] == "pending"  # its turn is being stopped
    assert (by_id["never"]["run_id"], 0) in world.queue.stops


def test_all_settled_waits_for_every_branch_then_fails_if_any_failed(
    world: World, settings: Settings
) -> None:
    flow = _drafts(join="all_settled", long=_done([["failed"]], error="nope"))
    # Long enough that three rounds on a loaded machine (the suite runs two processes) cannot
    # see it finish.
    flow["steps"][0]["parallel"]["steps"][2]["with"] = _done([["running", 1.0], ["completed"]])
    run_id = world.launch(flow)
    world.pump(rounds=3)
    assert world.record(run_id).status == "parked"  # "never" still runs: all_settled waits
    world.pump()
    record = world.record(run_id)
    assert (record.status, record.stop_reason) == ("failed", "step_failed")
    assert [b["status"] for b in record.steps[0].branches] == ["completed", "failed", "completed"]


def test_parallel_output_is_a_map_by_step_id(world: World) -> None:
    flow = _drafts()
    flow["steps"][0]["parallel"]["steps"].pop()
    run_id = world.launch(flow)
    world.pump()
    record = world.record(run_id)
    assert record.status == "completed"
    assert record.result == {"short": "short", "long": "long"}


def test_cancel_mid_fan_out_ends_every_branch_and_starts_nothing_after(world: World) -> None:
    flow = _research(max_concurrency=2)
    flow["steps"][0]["step"]["with"] = _done([["running"]])
    run_id = world.launch(flow, {"topics": ["a", "b", "c"]})
    world.pump(rounds=2)
    record = world.orch.cancel(run_id, owner=OWNER)
    assert (record.status, record.stop_reason) == ("cancelled", "cancel_requested")
    branches = [world.record(b["run_id"]) for b in record.steps[0].branches]
    assert [(b.status, b.stop_reason) for b in branches] == [("cancelled", "parent_ended")] * 3
    assert [b.steps[0].status for b in branches] == ["cancelled"] * 3
    sent = len(world.queue.chains)
    world.pump()
    assert len(world.queue.chains) == sent  # no slot was handed on after the cancel


def test_a_branch_parks_for_a_human_and_answering_it_resumes_that_branch_only(
    world: World,
) -> None:
    flow = _drafts()
    flow["steps"][0]["parallel"]["steps"][1]["with"] = _done(
        [["input_required"]], prompt="which tone?"
    )
    flow["steps"][0]["parallel"]["steps"].pop()
    run_id = world.launch(flow)
    world.pump()
    record = world.record(run_id)
    assert (record.status, record.park_reason) == ("parked", "branches")
    long = record.steps[0].branches[1]
    branch = world.record(long["run_id"])
    assert (branch.status, branch.park_reason) == ("parked", "human")
    world.orch.answer(long["run_id"], "long", "dry", owner=OWNER)
    world.pump()
    record = world.record(run_id)
    assert record.status == "completed"
    assert record.result["long"] == "dry"


class Forgetful(Executor):
    """An executor whose process dies after every commit, before settling a join."""

    def carry(self, then: Followups) -> None:
        super().carry(Followups(then.chains, then.revoke, then.stops, then.ends))


def test_a_lost_join_hand_off_is_sent_again_by_the_sweeper(
    world: World, settings: Settings
) -> None:
    world.stepper = Stepper(settings, Forgetful(settings, world.queue), clock=world.clock)
    run_id = world.launch(_research(), {"topics": ["a", "b"]})
    world.pump()
    record = world.record(run_id)
    assert (record.status, record.park_reason) == ("parked", "branches")
    assert {b["status"] for b in record.steps[0].branches} == {"completed"}
    said = world.orch.explain(run_id, owner=OWNER)
    assert "2 of 2 branches ended" in said["why"]
    report = Sweeper(settings, world.executor, clock=world.clock).sweep()
    assert report["branches_settled"] == 1
    world.pump()
    assert world.record(run_id).status == "completed"
    assert Sweeper(settings, world.executor, clock=world.clock).sweep()["branches_settled"] == 0


def test_duplicate_delivery_of_the_branching_step_writes_its_branches_once(world: World) -> None:
    run_id = world.launch(_research(), {"topics": ["a", "b"]})
    plan = world.queue.chains[0]
    assert world.stepper.advance(run_id, 0, 0) == Halt("waiting for branches")
    assert isinstance(world.stepper.advance(run_id, 0, 0), Halt)
    assert isinstance(world.stepper.advance(run_id, 0, 1), Halt)
    assert len(world.record(run_id).steps[0].branches) == 2
    assert plan.run_id == run_id


def test_an_empty_for_each_completes_its_step_with_an_empty_list(world: World) -> None:
    run_id = world.launch(_research(), {"topics": []})
    world.pump()
    record = world.record(run_id)
    assert record.status == "completed"
    assert (record.steps[0].output, record.steps[0].branches) == ([], None)
    assert record.result == []


def test_the_items_are_checked_at_launch_and_at_the_step(world: World, settings: Settings) -> None:
    with pytest.raises(ValidationError, match="for_each: must be a JSON list"):
        parse(_research(), settings, args={"topics": "ants"})
    with pytest.raises(LimitExceeded, match="ORCH_MAX_BRANCHES"):
        parse(_research(), settings, args={"topics": list(range(settings.max_branches + 1))})
    with pytest.raises(LimitExceeded, match="ORCH_MAX_BRANCH_CONCURRENCY"):
        parse(_research(max_concurrency=settings.max_branch_concurrency + 1), settings)
    with pytest.raises(ValidationError, match="only known in a for_each branch"):
        parse({"name": "x", "steps": [step_spec("a", task="{{ item }}")]}, settings)
    nested = _drafts()
    nested["steps"][0]["parallel"]["steps"][0] = _research()["steps"][0]
    with pytest.raises(ValidationError, match="cannot itself branch"):
        parse(nested, settings)
    # A list that only a step's output gives is checked when the step runs: the run fails.
    flow = {
        "name": "later",
        "steps": [
            step_spec("list", with_=_done(output="not a list")),
            {**_research()["steps"][0], "for_each": "{{ steps.list.output }}"},
        ],
    }
    run_id = world.launch(flow)
    world.pump()
    record = world.record(run_id)
    assert (record.status, record.stop_reason) == ("failed", "step_failed")
    assert "must be a JSON list" in (record.error or "")


def test_a_parent_parked_on_branches_states_its_budget_as_its_deadline(
    world: World, settings: Settings
) -> None:
    flow = _research()
    flow["steps"][0]["step"]["with"] = _done([["running"]])
    run_id = world.launch(flow, {"topics": ["a"]})
    world.pump(rounds=1)
    run = run_row(settings, run_id)
    assert run.parked_since is not None
    assert run.deadline_at == run.parked_since + timedelta(
        seconds=settings.park_budget_branches + deadlines.slack_seconds(settings)
    )
    world.clock.advance(settings.park_budget_branches + 1)
    report = Sweeper(settings, world.executor, clock=world.clock).sweep()
    assert report["parks_expired"] == 1
    record = world.record(run_id)
    assert (record.status, record.stop_reason) == ("timed_out", "park_expired")
    branch = world.record(record.steps[0].branches[0]["run_id"])
    assert (branch.status, branch.stop_reason) == ("cancelled", "parent_ended")
