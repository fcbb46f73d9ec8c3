"""A new step's start on PostgreSQL in one statement (``execution.fence``'s pieces): fenced,
claimed and its run stamped with no transaction around it, and what it leaves to a
transaction: a duplicate delivery, a run's first step, a task that names data, a cancel
that commits while the statement waits for the run row.

In-process against the module's PostgreSQL database, the stepper driven as the step task
drives it. Skipped without ``ORCH_TEST_DATABASE_URL`` (with ``CI=true`` the suite refuses to
start without it).
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import update

from orchestration.core.db import session_scope
from orchestration.core.models import Run
from orchestration.core.settings import Settings
from orchestration.execution import Halt, Poll, Proceed, Stepper
from orchestration.providers.scripted import ScriptedProvider
from tests.conftest import DATABASE_URL
from tests.integration.conftest import Stack
from tests.support.statements import await_blocked, sent, stepper_on
from tests.unit.support import events_of, launch, run_row, step_spec, steps_of, workflow

pytestmark = pytest.mark.skipif(
    not DATABASE_URL, reason="needs PostgreSQL (ORCH_TEST_DATABASE_URL): SQLite has no DML CTEs"
)
INSTANT = {"states": [["completed"]]}
RUNNING = {"states": [["running", 100000], ["completed"]]}


def _second_step_due(settings: Settings, second: dict[str, object]) -> tuple[Stepper, str]:
    """A run whose first (instant) step has completed, its second step ``second`` pending."""
    stepper, _ = stepper_on(settings)
    run_id = launch(settings, workflow(step_spec("a", with_=INSTANT), second))
    assert isinstance(stepper.advance(run_id, 0, 0), Proceed)
    return stepper, run_id


def _starts(settings: Settings, run_id: str, step_id: str) -> list[str]:
    """The outcomes of the provider's start calls for the step's first attempt."""
    calls = ScriptedProvider(settings).start_calls(f"{run_id}:{step_id}:")
    return [call["outcome"] for call in calls]


def _turn_starting(settings: Settings, run_id: str, step_id: str) -> list[tuple[str, str]]:
    return [
        (event.from_status, event.to_status)
        for event in events_of(settings, run_id)
        if event.step_id == step_id and event.cause == "turn starting"
    ]


def test_a_new_step_is_fenced_claimed_and_stamped_in_one_statement(stack: Stack) -> None:
    settings = stack.settings
    stepper, run_id = _second_step_due(settings, step_spec("b", task="say hi", with_=RUNNING))
    with sent(settings) as seen:
        outcome = stepper.advance(run_id, 1, 0)
    assert isinstance(outcome, Poll), outcome
    # The start's one statement in autocommit, then the write that records the turn.
    assert seen.statements[0] == ("WITH", True), seen.statements
    assert seen.engine_transactions == [["WITH"], ["WITH", "UPDATE"]], seen.engine_transactions
    step = steps_of(settings, run_id)[1]
    assert (step.status, step.input, step.polls) == ("running", "say hi", 1)
    assert step.started_at is not None and step.provider_run_id is not None
    assert step.start_claimed_at is None  # the write cleared the claim
    assert (step.worker, step.worker_pid) == ("it", 1)
    assert _turn_starting(settings, run_id, "b") == [("pending", "running")]
    assert _starts(settings, run_id, "b") == ["started"]
    run = run_row(settings, run_id)
    assert (run.status, run.current_step, run.heartbeat_at) == ("running", 1, step.started_at)


def test_a_duplicate_delivery_of_the_start_starts_nothing(stack: Stack) -> None:
    settings = stack.settings
    stepper, run_id = _second_step_due(settings, step_spec("b", with_=RUNNING))
    assert isinstance(stepper.advance(run_id, 1, 0), Poll)
    again = stepper.advance(run_id, 1, 0)
    assert isinstance(again, Halt) and "duplicate" in again.reason, again
    assert _starts(settings, run_id, "b") == ["started"]
    assert _turn_starting(settings, run_id, "b") == [("pending", "running")]


def test_a_task_that_names_data_takes_the_full_claim(stack: Stack) -> None:
    """Its task is rendered from the run's outputs, in the full claim's transaction: no start
    statement is sent."""
    settings = stack.settings
    second = step_spec("b", task="after {{ steps.a.output }}", with_=RUNNING)
    stepper, run_id = _second_step_due(settings, second)
    with sent(settings) as seen:
        assert isinstance(stepper.advance(run_id, 1, 0), Poll)
    assert ("WITH", True) not in seen.statements, seen.statements
    assert _turn_starting(settings, run_id, "b") == [("pending", "running")]


def test_a_message_for_a_run_that_is_gone_halts(stack: Stack) -> None:
    """No run, no specs: the start fence leaves it to the full entry, which halts."""
    stepper, _ = stepper_on(stack.settings)
    assert stepper.advance("no-such-run", 1, 0) == Halt("no such run")


def test_a_structured_task_is_claimed_as_it_is(stack: Stack) -> None:
    settings = stack.settings
    task = {"say": ["hi", 2], "to": None}
    stepper, run_id = _second_step_due(settings, step_spec("b", task=task, with_=RUNNING))
    with sent(settings) as seen:
        assert isinstance(stepper.advance(run_id, 1, 0), Poll)
    assert seen.statements[0] == ("WITH", True), seen.statements
    assert steps_of(settings, run_id)[1].input == task


def test_a_runs_first_step_claims_in_the_statement_and_moves_its_run_in_a_transaction(
    stack: Stack,
) -> None:
    """The run is still ``queued``: the statement fences and claims the step but cannot stamp
    a running run, so a transaction stamps the queued run (its lock orders the claim before
    any cancel) and moves it on, without fencing or claiming again."""
    settings = stack.settings
    stepper, _ = stepper_on(settings)
    run_id = launch(settings, workflow(step_spec("a", with_=RUNNING)))
    with sent(settings) as seen:
        assert isinstance(stepper.advance(run_id, 0, 0), Poll)
    assert seen.statements[0] == ("WITH", True), seen.statements
    assert run_row(settings, run_id).status == "running"
    step = steps_of(settings, run_id)[0]
    assert (step.polls, step.status) == (1, "running")
    assert len(_starts(settings, run_id, "a")) == 1


def test_a_cancel_committed_while_the_start_waits_for_the_run_starts_no_turn(
    stack: Stack,
) -> None:
    """The statement's snapshot shows no cancel, so its fence claims the step; its stamp then
    waits for the run row, which the cancel holds. Once the cancel commits the stamp fails,
    and the execution must call no provider: it goes on in the full entry, which honours the
    cancel and ends the run."""
    settings = stack.settings
    stepper, run_id = _second_step_due(settings, step_spec("b", with_=RUNNING))
    outcome: list[object] = []
    starter = threading.Thread(target=lambda: outcome.append(stepper.advance(run_id, 1, 0)))
    with session_scope(settings.database_url) as cancel:
        cancel.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(cancel_requested_at=run_row(settings, run_id).updated_at)
        )
        starter.start()
        await_blocked(settings, "the start")
    starter.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], Halt), outcome
    assert _starts(settings, run_id, "b") == []
    # The fence did claim (and journal it) before its stamp failed; the cancel ended the step.
    assert _turn_starting(settings, run_id, "b") == [("pending", "running")]
    assert run_row(settings, run_id).status == "cancelled"
    assert steps_of(settings, run_id)[1].status == "cancelled"
