"""What one step execution costs, and what a chain message carries (docs/architecture.md):

* a poll that changes nothing is one transaction of two statements (the fence and the stamp);
  on PostgreSQL one statement outside any transaction
  (``tests/integration/test_postgres_statements.py``), or these two with ``single_statement``
  off;
* a turn already finished at its start is finished in that execution, in two transactions;
* a chain goes out in segments of at most ``SEGMENT_LINKS`` links, and the step that finishes
  without a next link in its message (the last of a segment, or one that polled) arms the
  next segment in the transaction that completes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, update

from orchestration.core.db import get_engine, session_scope
from orchestration.core.followups import ChainPlan
from orchestration.core.settings import Settings
from orchestration.execution import Poll, Proceed, Stepper
from orchestration.providers.scripted import TURNS, store_url
from orchestration.runs.chains import SEGMENT_LINKS, plan_chain
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from tests.unit.support import (
    T0,
    Clock,
    RecordingDispatcher,
    launch,
    run_row,
    step_spec,
    steps_of,
    workflow,
)

RUNNING = {"states": [["running", 1000], ["completed"]]}
INSTANT = {"states": [["completed"]]}


@dataclass
class Count:
    statements: list[str] = field(default_factory=list)
    transactions: int = 0


@contextmanager
def counting(settings: Settings) -> Iterator[Count]:
    """Statements and transactions on the engine's database (not the scripted provider's)."""
    engine = get_engine(settings.database_url)
    count = Count()

    def statement(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        count.statements.append(sql.split(None, 1)[0].upper())

    def begin(_conn: Any) -> None:
        count.transactions += 1

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "begin", begin)
    try:
        yield count
    finally:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "begin", begin)


@pytest.fixture
def settings(settings_factory: Callable[..., Settings], tmp_path: Path) -> Settings:
    """The statements counted here are the sequence's: SQLite's, and PostgreSQL's with
    ``single_statement`` off (its one-statement forms are counted by the integration test named
    above). The scripted provider keeps its turns in a file of its own, so that only the engine's
    statements are counted."""
    return settings_factory(
        single_statement=False, scripted_url=f"sqlite:///{tmp_path / 'turns.db'}"
    )


def _stepper(settings: Settings, queue: Any = None) -> Stepper:
    return Stepper(settings, Executor(settings, queue), clock=Clock(T0), worker="unit", pid=1)


def _age_turns(settings: Settings, seconds: float) -> None:
    with session_scope(store_url(settings)) as session:
        for key, started in session.execute(select(TURNS.c.key, TURNS.c.started_at)).all():
            session.execute(
                update(TURNS)
                .where(TURNS.c.key == key)
                .values(started_at=started - timedelta(seconds=seconds))
            )


def test_a_poll_that_changes_nothing_is_one_transaction_of_two_statements(
    settings: Settings,
) -> None:
    run_id = launch(settings, workflow(step_spec(with_=RUNNING)))
    stepper = _stepper(settings)
    started = stepper.advance(run_id, 0, 0)
    assert isinstance(started, Poll)
    first = stepper.advance(run_id, 0, started.tick)
    assert isinstance(first, Poll)
    before = steps_of(settings, run_id)[0]
    with counting(settings) as count:
        again = stepper.advance(run_id, 0, first.tick)
    assert isinstance(again, Poll) and again.tick == first.tick + 1
    assert (count.transactions, count.statements) == (1, ["UPDATE", "UPDATE"])
    after = steps_of(settings, run_id)[0]
    assert (after.polls, after.last_provider_status) == (before.polls + 1, "running")
    assert run_row(settings, run_id).heartbeat_at == T0


def test_an_instant_step_finishes_in_its_first_execution(settings: Settings) -> None:
    run_id = launch(settings, workflow(step_spec("a", with_=INSTANT), step_spec("b")))
    with counting(settings) as count:
        assert _stepper(settings).advance(run_id, 0, 0) == Proceed()
    assert count.transactions == 2
    first, second = steps_of(settings, run_id)
    assert (first.status, first.polls, second.status) == ("completed", 1, "pending")
    run = run_row(settings, run_id)
    assert (run.status, run.current_step) == ("running", 1)


def test_a_chain_is_planned_in_segments() -> None:
    for length in (1, SEGMENT_LINKS, SEGMENT_LINKS + 1, 200):
        plan = plan_chain("r", 0, length)
        assert [link.index for link in plan.links] == list(range(min(length, SEGMENT_LINKS)))
    tail = plan_chain("r", 199, 200, 7)
    assert [(link.index, link.tick) for link in tail.links] == [(199, 7)]


def _play(settings: Settings, stepper: Stepper, queue: RecordingDispatcher, run_id: str) -> None:
    """Play the broker and the task body: deliver each sent segment's links in order, a link
    being ``chained`` when its segment has a link after it; a Poll drops the rest of the
    segment (the step task clears ``request.chain`` before it retries)."""
    delivered = 0
    while delivered < len(queue.chains):
        plan: ChainPlan = queue.chains[delivered]
        delivered += 1
        for position, link in enumerate(plan.links):
            chained = position < len(plan.links) - 1
            outcome = stepper.advance(run_id, link.index, link.tick, chained=chained)
            while isinstance(outcome, Poll):
                _age_turns(settings, 2000)
                outcome = stepper.advance(run_id, link.index, outcome.tick, chained=False)
            if not (isinstance(outcome, Proceed) and chained):
                break


def test_a_long_run_goes_out_in_segments_and_completes(settings: Settings) -> None:
    steps = [step_spec(f"s{i}", with_=INSTANT) for i in range(2 * SEGMENT_LINKS + 1)]
    queue = RecordingDispatcher()
    run_id = launch(settings, workflow(*steps), dispatcher=queue)
    _play(settings, _stepper(settings, queue), queue, run_id)
    assert [[link.index for link in plan.links] for plan in queue.chains] == [
        list(range(0, SEGMENT_LINKS)),
        list(range(SEGMENT_LINKS, 2 * SEGMENT_LINKS)),
        [2 * SEGMENT_LINKS],
    ]
    assert run_row(settings, run_id).status == "completed"
    stored = [step.celery_task_id for step in steps_of(settings, run_id)]
    assert stored == [link.task_id for plan in queue.chains for link in plan.links]


def test_a_step_that_polled_arms_the_rest_of_the_run(settings: Settings) -> None:
    steps = [step_spec("a", with_=INSTANT), step_spec("b", with_=RUNNING), step_spec("c")]
    queue = RecordingDispatcher()
    run_id = launch(settings, workflow(*steps), dispatcher=queue)
    _play(settings, _stepper(settings, queue), queue, run_id)
    first = list(range(min(SEGMENT_LINKS, 3)))
    assert [[link.index for link in plan.links] for plan in queue.chains] == [first, [2]]
    assert run_row(settings, run_id).status == "completed"


def test_a_launch_is_one_transaction_that_reads_nothing_back(settings: Settings) -> None:
    """One statement reads the request id and the budgets, then the inserts (the run and its
    steps; the database journals the run), then one read of its health as the SQL judges it:
    the record it returns is otherwise built from the rows it wrote, not read again."""
    orch = Orchestrator(settings, RecordingDispatcher(), clock=Clock(T0))
    flow = workflow(step_spec("a", with_=INSTANT), step_spec("b", with_=INSTANT))
    orch.launch(flow, owner="o", request_id="warm")
    with counting(settings) as count:
        record = orch.launch(flow, owner="o", request_id="r1")
    # PostgreSQL batches the step rows into one INSERT; SQLite sends one per step.
    assert count.transactions == 1
    assert count.statements[:1] == ["SELECT"] and count.statements[-1:] == ["SELECT"]
    inserts = count.statements[1:-1]
    assert set(inserts) == {"INSERT"} and len(inserts) <= 1 + 2
    assert [step.step_id for step in record.steps] == ["a", "b"]
    assert record == orch.get(record.id, owner="o")
