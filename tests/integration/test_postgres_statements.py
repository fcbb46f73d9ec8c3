"""What PostgreSQL does in one statement: a poll's entry with no transaction around it
(``execution.fence``'s pieces; what that statement cannot finish goes on in a transaction),
a transition (whose journal row the database writes), a launch.

In-process against the module's PostgreSQL database (no worker: the stepper is driven as the
step task drives it). Without ``ORCH_TEST_DATABASE_URL`` there is no PostgreSQL to run on and
the module is skipped (with ``CI=true`` the suite refuses to start without it).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, select, text

from orchestration.core import pieces
from orchestration.core.db import get_engine, postgresql_url, session_scope, utcnow
from orchestration.core.errors import (
    IdempotencyConflict,
    IllegalTransition,
    LimitExceeded,
    RetryableProviderError,
)
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import RunStatus, StepStatus
from orchestration.execution import Halt, Poll, Proceed, Stepper, fence
from orchestration.execution.rows import STARTABLE, Moved, lock
from orchestration.providers.base import TurnRef, TurnRequest
from orchestration.providers.scripted import ScriptedProvider, store_url
from orchestration.runs import concurrency, launch_statement, launching
from orchestration.runs.transitions import lock_run, touch_step, transition_run, transition_step
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from tests.conftest import DATABASE_URL
from tests.integration.conftest import Stack
from tests.support.statements import await_blocked, sent, stepper_on
from tests.unit.support import (
    T0,
    Clock,
    events_of,
    force,
    launch,
    run_row,
    step_spec,
    steps_of,
    workflow,
)

pytestmark = pytest.mark.skipif(
    not DATABASE_URL, reason="needs PostgreSQL (ORCH_TEST_DATABASE_URL): SQLite has no DML CTEs"
)
RUNNING = {"states": [["running", 100000], ["completed"]]}


def _polling(stack: Stack) -> tuple[Stepper, Clock, str, int]:
    """A run whose turn started and keeps running, and the tick of its next poll."""
    settings = stack.settings
    stepper, clock = stepper_on(settings)
    run_id = launch(settings, workflow(step_spec(with_=RUNNING)), now=T0)
    started = stepper.advance(run_id, 0, 0)
    assert isinstance(started, Poll), started
    return stepper, clock, run_id, started.tick


def test_postgresql_takes_the_fast_entry(stack: Stack) -> None:
    assert postgresql_url(stack.settings.database_url)


def test_a_poll_is_one_statement_outside_a_transaction(stack: Stack) -> None:
    stepper, clock, run_id, tick = _polling(stack)
    clock.advance(3)
    with sent(stack.settings) as seen:
        again = stepper.advance(run_id, 0, tick)
    assert again == Poll(again.countdown, tick + 1), again
    assert seen.statements == [("WITH", True)]
    step = steps_of(stack.settings, run_id)[0]
    assert (step.polls, step.worker, step.worker_pid) == (tick + 1, "it", 1)
    run = run_row(stack.settings, run_id)
    assert (run.status, run.heartbeat_at, run.current_step) == ("running", clock(), 0)
    assert run.deadline_at is not None and run.deadline_at > clock()


def test_a_poll_commits_without_waiting_for_the_disk_and_only_itself(stack: Stack) -> None:
    """A poll's entry, sent as one statement in autocommit, turns ``synchronous_commit`` off
    for its own implicit transaction: in effect while it runs, gone from the connection once
    it returned (a later write on the same pooled connection, a cancel say, still waits for
    its WAL)."""
    _, clock, run_id, tick = _polling(stack)
    settings = stack.settings
    bound = fence.params(settings, run_id, 0, tick, clock(), "it", 1)
    with session_scope(settings.database_url, autocommit=True) as session:
        sent_rows = pieces.send(session, fence.ENTER_UNJUDGED, bound, durable=False)
        assert sent_rows["stamped"] is not None
        after = session.connection().exec_driver_sql("SHOW synchronous_commit").scalar_one()
    assert after == "on"
    assert steps_of(settings, run_id)[0].polls == tick + 1
    # Sent durable (a claim, or inside a transaction), the same pieces leave the setting be.
    assert "set_config" in str(pieces._composed(fence.ENTER_UNJUDGED, False).statement)
    assert "set_config" not in str(pieces._composed(fence.ENTER_UNJUDGED, True).statement)


def test_a_poll_updates_the_run_and_the_step_in_place(stack: Stack) -> None:
    """Neither row's stamp touches an indexed column, so PostgreSQL updates both in place
    (HOT: no index entry written), counted by this backend around the statement."""
    _, clock, run_id, tick = _polling(stack)
    bound = fence.params(stack.settings, run_id, 0, tick, clock(), "it", 1)
    counts = text(
        "SELECT pg_stat_get_xact_tuples_updated(CAST(:table AS regclass)),"
        " pg_stat_get_xact_tuples_hot_updated(CAST(:table AS regclass))"
    )
    with session_scope(stack.settings.database_url) as session:

        def read() -> dict[str, tuple[int, int]]:
            # This backend's counts not yet reported, this transaction's included.
            return {
                table: tuple(session.execute(counts, {"table": table}).one())
                for table in ("runs", "steps")
            }

        before = read()
        assert pieces.send(session, fence.ENTER_UNJUDGED, bound)["stamped"] is not None
        after = read()
        session.rollback()
    moved = {
        table: (after[table][0] - before[table][0], after[table][1] - before[table][1])
        for table in after
    }
    assert moved == {"runs": (1, 1), "steps": (1, 1)}


def test_a_stale_delivery_writes_nothing(stack: Stack) -> None:
    stepper, clock, run_id, tick = _polling(stack)
    assert isinstance(stepper.advance(run_id, 0, tick), Poll)
    before = run_row(stack.settings, run_id)
    clock.advance(3)
    with sent(stack.settings) as seen:
        stale = stepper.advance(run_id, 0, tick)
    assert stale == Halt("duplicate or stale delivery")
    # The fast statement matched nothing; the full entry's fence then refused it too.
    assert seen.statements[0] == ("WITH", True)
    assert steps_of(stack.settings, run_id)[0].polls == tick + 1
    assert run_row(stack.settings, run_id).heartbeat_at == before.heartbeat_at


def test_a_fence_the_run_refuses_goes_on_in_the_full_entry(stack: Stack) -> None:
    """A cancel requested: the statement fences the step but cannot stamp the run; a
    transaction goes on from the tick it fenced (without fencing again) and the execution
    honours the cancel."""
    stepper, clock, run_id, tick = _polling(stack)
    force(stack.settings, run_id, cancel_requested_at=clock())
    clock.advance(1)
    with sent(stack.settings) as seen:
        outcome = stepper.advance(run_id, 0, tick)
    assert outcome == Halt("cancel honoured", revoked=True)
    assert seen.statements[0] == ("WITH", True)
    assert all(not autocommit for _, autocommit in seen.statements[1:])
    assert run_row(stack.settings, run_id).status == "cancelled"
    step = steps_of(stack.settings, run_id)[0]
    assert (step.status, step.polls) == ("cancelled", tick + 1)


def test_a_parked_run_is_polled_through_the_full_entry(stack: Stack) -> None:
    """Parked for a platform interrupt: a transaction stamps it on its status, and the poll
    that sees the turn working again unparks it."""
    stepper, clock, run_id, tick = _polling(stack)
    force(stack.settings, run_id, status="parked", park_reason="platform_interrupt")
    clock.advance(1)
    with sent(stack.settings) as seen:
        outcome = stepper.advance(run_id, 0, tick)
    assert isinstance(outcome, Poll) and outcome.tick == tick + 1
    assert seen.statements[0] == ("WITH", True)
    run = run_row(stack.settings, run_id)
    assert (run.status, run.park_reason, run.heartbeat_at) == ("running", None, clock())


def test_a_transition_is_one_statement_and_the_database_journals_it(stack: Stack) -> None:
    """The compare-and-set on the sources the state machine allows is the one statement a
    transition sends; the journal row is the database's (``status_triggers``)."""
    settings = stack.settings
    run_id = launch(settings, workflow(step_spec(with_=RUNNING)), now=T0)
    step = steps_of(settings, run_id)[0]
    with sent(settings) as seen, session_scope(settings.database_url) as session:
        transition_step(session, step, StepStatus.RUNNING, cause="test", now=T0)
    assert [word for word, _ in seen.statements] == ["UPDATE"]
    moves = [e for e in events_of(settings, run_id) if e.step_id == step.step_id]
    assert [(e.from_status, e.to_status) for e in moves] == [("pending", "running")]
    assert steps_of(settings, run_id)[0].status == "running"


def test_a_refused_transition_journals_nothing(stack: Stack) -> None:
    settings = stack.settings
    run_id = launch(settings, workflow(step_spec(with_=RUNNING)), now=T0)
    force(settings, run_id, status="cancelled", stop_reason="cancel_requested")
    before = len(events_of(settings, run_id))
    with pytest.raises(IllegalTransition), session_scope(settings.database_url) as session:
        transition_run(session, run_id, RunStatus.RUNNING, cause="test", now=T0)
    assert len(events_of(settings, run_id)) == before
    assert run_row(settings, run_id).status == "cancelled"


def test_a_scripted_start_is_one_statement_and_a_repeat_is_still_journaled(stack: Stack) -> None:
    """The scripted provider's start on PostgreSQL: the turn and its start call in one
    statement; the same key again begins no second turn, and its call is journaled too."""
    provider = ScriptedProvider(stack.settings)
    key = f"pg-{uuid.uuid4().hex}:a:1"
    request = TurnRequest(key, "run", "a", 1, "do it", {"states": [["running", 60]]})
    engine = get_engine(store_url(stack.settings))
    statements: list[str] = []

    def statement(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        statements.append(sql.split(None, 1)[0].upper())

    event.listen(engine, "before_cursor_execute", statement)
    try:
        first = provider.start(request)
        once = list(statements)
        again = provider.start(request)
    finally:
        event.remove(engine, "before_cursor_execute", statement)
    assert first == again
    assert once == ["WITH"]
    assert [call["outcome"] for call in provider.start_calls(key)] == ["started", "existing"]
    assert len(provider.turns(key)) == 1


def test_a_scripted_start_past_its_deadline_is_refused_on_the_store_clock(stack: Stack) -> None:
    """On PostgreSQL the deadline is judged by when the statement arrived
    (``statement_timestamp()``), in the one statement and in the fallback after a cancel's
    tombstone; a start inside its deadline is still one statement."""
    provider = ScriptedProvider(stack.settings)
    key = f"pg-{uuid.uuid4().hex}:a:1"
    request = TurnRequest(key, "run", "a", 1, "do it", {"states": [["running", 60]]})
    with pytest.raises(RetryableProviderError, match="after its deadline"):
        provider.start(replace(request, deadline=utcnow() - timedelta(seconds=1)))
    assert provider.turns(key) == []
    provider.cancel(TurnRef(key, None, request.options))
    with pytest.raises(RetryableProviderError, match="after its deadline"):
        provider.start(replace(request, deadline=utcnow() - timedelta(seconds=1)))
    calls = provider.start_calls(key)
    assert [call["outcome"] for call in calls] == ["expired", "expired"]
    other = f"pg-{uuid.uuid4().hex}:a:1"
    sent = utcnow()
    provider.start(replace(request, key=other, deadline=sent + timedelta(seconds=30)))
    [call] = provider.start_calls(other)
    assert call["outcome"] == "started"
    assert abs((call["called_at"] - sent).total_seconds()) < 1.0


def test_a_cancel_between_polls_is_three_transactions_of_the_engine(stack: Stack) -> None:
    """The request, its owner checked on the row it locks (no read before it); the terminal
    rows; the record it returns. The provider's own cancel apart."""
    settings = stack.settings
    _, _, run_id, _ = _polling(stack)
    with sent(settings) as seen:
        record = Orchestrator(settings, None).cancel(run_id, owner="owner-1")
    assert record.status == "cancelled"
    assert seen.engine_transactions == [
        # The run taken and read in one UPDATE, moved to cancelling; the starts in flight;
        # none being there, the live turns, read under the lock.
        ["UPDATE", "UPDATE", "SELECT", "SELECT"],
        # The run taken and read again, moved to cancelled; its live step, moved; the turn's
        # stop recorded.
        ["UPDATE", "UPDATE", "SELECT", "UPDATE", "UPDATE"],
        # The record: the run with its health judged in one statement, its steps, its reruns.
        ["SELECT", "SELECT", "SELECT"],
    ]


def test_a_launch_is_one_statement_outside_a_transaction(stack: Stack) -> None:
    settings = stack.settings
    with sent(settings) as seen:
        run_id = launch(settings, workflow(step_spec(), step_spec("b")), request_id=_rid())
    assert seen.statements == [("WITH", True)]
    run = run_row(settings, run_id)
    assert (run.status, len(run.task_ids)) == ("queued", 2)
    assert [step.status for step in steps_of(settings, run_id)] == ["pending", "pending"]
    assert [(event.to_status, event.cause) for event in events_of(settings, run_id)] == [
        ("queued", "launched")
    ]


def test_a_replay_and_a_conflict_are_answered_by_the_one_statement(stack: Stack) -> None:
    settings = stack.settings
    request_id = _rid()
    first = launch(settings, workflow(step_spec()), request_id=request_id)
    with sent(settings) as seen:
        again = launch(settings, workflow(step_spec()), request_id=request_id)
    assert again == first
    # The statement met the request id, wrote nothing and returned the run it names; the
    # record is read in autocommit too: no transaction.
    assert seen.statements[0] == ("WITH", True)
    assert all(autocommit for _, autocommit in seen.statements)
    with pytest.raises(IdempotencyConflict):
        launch(settings, workflow(step_spec(task="other")), request_id=request_id)
    assert len(events_of(settings, first)) == 1
    with session_scope(settings.database_url) as session:
        count = session.scalar(
            select(func.count()).select_from(Run).where(Run.request_id == request_id)
        )
    assert count == 1


def test_a_launch_over_its_owner_limit_is_refused_and_writes_nothing(stack: Stack) -> None:
    settings = stack.settings.model_copy(update={"max_active_runs_per_owner": 1})
    owner = f"limited-{uuid.uuid4().hex[:8]}"
    launch(settings, workflow(step_spec()), owner=owner, request_id=_rid())
    with pytest.raises(LimitExceeded):
        launch(settings, workflow(step_spec()), owner=owner, request_id=_rid())
    with session_scope(settings.database_url) as session:
        count = session.scalar(select(func.count()).select_from(Run).where(Run.owner == owner))
    assert count == 1


def test_a_long_launch_is_the_same_one_statement_as_a_short_one(stack: Stack) -> None:
    settings = stack.settings.model_copy(update={"max_steps": 200})
    with sent(settings) as seen:
        short = launch(settings, workflow(step_spec()), request_id=_rid())
        long = launch(
            settings, workflow(*(step_spec(f"s{index}") for index in range(200))), request_id=_rid()
        )
    # One statement each, the same text and parameter count: built, converted and planned once.
    texts = seen.texts
    assert len(texts) == 2 and texts[0] == texts[1], [(sql[:40], count) for sql, count in texts]
    assert len(steps_of(settings, short)) == 1
    assert [step.step_id for step in steps_of(settings, long)] == [f"s{i}" for i in range(200)]


def test_the_one_statement_writes_the_rows_the_transaction_writes(stack: Stack) -> None:
    settings = stack.settings
    definition = workflow(step_spec(), step_spec("b", with_=RUNNING))
    written = []
    for once in (True, False):
        run_id = launching.launch_then(
            Executor(settings, None),
            settings,
            definition,
            {"topic": "x"},
            owner="owner-1",
            request_id=_rid(),
            concurrency_key=None,
            on_conflict=concurrency.OnConflict.REJECT,
            now=T0,
            read=lambda _, made: made.run.id,
            once=once,
        )
        written.append(
            (
                _columns(run_row(settings, run_id), run_id, {"id", "request_id", "task_ids"}),
                [
                    _columns(step, run_id, {"pk", "celery_task_id"})
                    for step in steps_of(settings, run_id)
                ],
                [_columns(event, run_id, {"id"}) for event in events_of(settings, run_id)],
                _nulls(settings, run_id),
            )
        )
    assert written[0] == written[1]


def test_the_one_statement_refuses_steps_that_differ_in_a_shared_column(stack: Stack) -> None:
    settings = stack.settings
    run_id, request_id = _rid(), _rid()
    run = {"id": run_id, "owner": "owner-1", "request_id": request_id}
    steps = [
        {"index": index, "step_id": f"s{index}", "run_id": run_id, "attempt": attempt}
        for index, attempt in enumerate((1, 2))
    ]
    with session_scope(settings.database_url) as session, pytest.raises(ValueError, match="differ"):
        launch_statement.write(session, settings, run, steps)
    with session_scope(settings.database_url) as session:
        assert session.scalar(select(func.count()).where(Run.request_id == request_id)) == 0


def _nulls(settings: Settings, run_id: str) -> list[tuple[bool, ...]]:
    """Which columns are SQL ``NULL`` (a JSON ``null`` reads back as ``None`` as well)."""
    rows = []
    with session_scope(settings.database_url) as session:
        for table, key in ((Run.__table__, "id"), (Step.__table__, "run_id")):
            nulls = select(*(column.is_(None) for column in table.columns))
            rows += session.execute(nulls.where(table.c[key] == run_id)).all()
    return [tuple(row) for row in rows]


def _columns(row: Any, run_id: str, apart: set[str]) -> dict[str, Any]:
    """A row's columns but those that are new per launch (ids), with its run's id named
    ``RUN`` (a step's idempotency key holds it)."""
    values = {}
    for column in row.__table__.columns:
        value = getattr(row, column.key)
        if column.key not in apart:
            values[column.key] = value.replace(run_id, "RUN") if isinstance(value, str) else value
    return values


def _rid() -> str:
    return uuid.uuid4().hex


INSTANT = {"states": [["completed"]]}


def test_an_instant_step_completes_and_moves_its_run_in_its_write_statements(
    stack: Stack,
) -> None:
    """An instant step: its start (fence, claim and stamp) one statement in autocommit
    (``start_fence``), then its write transaction: the run's lock with the step's read, the
    checkpoint's record, and the step's completion with the run moved on, three statements
    (was five: the step read after the lock, the run's move after the step's)."""
    settings = stack.settings
    stepper, clock = stepper_on(settings)
    steps = [step_spec(step_id, with_=INSTANT) for step_id in "abc"]
    run_id = launch(settings, workflow(*steps), now=T0)
    assert isinstance(stepper.advance(run_id, 0, 0, chained=True), Proceed)
    later = clock.advance(5)
    with sent(settings) as seen:
        outcome = stepper.advance(run_id, 1, 0, chained=True)
    assert isinstance(outcome, Proceed), outcome
    assert seen.statements[0] == ("WITH", True), seen.statements
    assert seen.engine_transactions == [["WITH"], ["WITH", "WITH", "WITH"]], (
        seen.engine_transactions
    )
    run = run_row(settings, run_id)
    assert [step.status for step in steps_of(settings, run_id)] == [
        "completed",
        "completed",
        "pending",
    ]
    assert (run.status, run.current_step) == ("running", 2)
    assert run.heartbeat_at == later and run.updated_at == later
    assert run.deadline_at is not None and run.deadline_at > later


def test_a_step_that_does_not_move_leaves_its_run_untouched(stack: Stack) -> None:
    """The run's columns ride on the step's compare-and-set, as a piece after it: a step the
    state machine does not let move writes nothing, its run included, in one statement."""
    settings = stack.settings
    run_id = launch(settings, workflow(step_spec(with_=RUNNING)), now=T0)
    step = steps_of(settings, run_id)[0]
    later = T0 + timedelta(seconds=5)

    def move(to: StepStatus) -> None:
        with session_scope(settings.database_url) as session:
            transition_step(
                session, step, to, cause="test", now=later, run_values={"current_step": 7}
            )

    # From ``pending`` the step may not complete.
    with sent(settings) as seen, pytest.raises(IllegalTransition):
        move(StepStatus.COMPLETED)
    # The transition's statement, the refusal's read, and the transaction's end asking whether
    # it wrote anything (it did not: it ends with COMMIT, ``db.session_scope``).
    assert [word for word, _ in seen.statements] == ["WITH", "SELECT", "SELECT"]
    assert "txid_current_if_assigned" in seen.texts[-1][0]
    run = run_row(settings, run_id)
    assert (run.current_step, run.updated_at) == (0, T0)
    move(StepStatus.RUNNING)
    run = run_row(settings, run_id)
    assert (run.current_step, run.updated_at) == (7, later)


def test_a_write_sees_the_step_as_committed_while_it_waited_for_the_run(stack: Stack) -> None:
    """The run's lock and the step's read are one statement, whose snapshot is taken before
    it waits for the run row: the step is read with a lock, so a change committed under the
    run's lock meanwhile (here a newer execution's fence) is what the write sees, and it
    refuses (``Moved``) instead of writing over its successor."""
    settings = stack.settings
    _, _, run_id, tick = _polling(stack)
    step = steps_of(settings, run_id)[0]
    outcome: list[object] = []

    def write() -> None:
        try:
            with session_scope(settings.database_url) as session:
                lock(session, run_id, 0, tick, T0, STARTABLE)
            outcome.append("locked")
        except Moved:
            outcome.append("moved")

    with session_scope(settings.database_url) as holder:
        assert lock_run(holder, run_id, T0)
        touch_step(holder, step, T0, polls=tick + 1)
        waiter = threading.Thread(target=write)
        waiter.start()
        await_blocked(settings, "the write")
    waiter.join(10)
    assert outcome == ["moved"]
