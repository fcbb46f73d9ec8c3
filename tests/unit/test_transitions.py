"""The one writer of status, on a real database: compare-and-set plus the journal."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from itertools import product
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from orchestration.core.db import constant_in, session_scope
from orchestration.core.errors import IllegalTransition, RunNotFound
from orchestration.core.followups import Done, Followups
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import (
    RUN_LIVE,
    RUN_TERMINAL,
    RUN_TRANSITIONS,
    STEP_TERMINAL,
    STEP_TRANSITIONS,
    STOP_REASONS,
    ConcurrencyState,
    RunStatus,
    StepStatus,
    StopReason,
)
from orchestration.runs import concurrency
from orchestration.runs.closing import end_run
from orchestration.runs.transitions import (
    take_run,
    touch_run,
    touch_step,
    transition_run,
    transition_step,
)
from orchestration.runtime.executor import Executor
from tests.conftest import wait_for
from tests.unit.conftest import Databases
from tests.unit.support import (
    PROPERTY,
    T0,
    RecordingDispatcher,
    events_of,
    force_step,
    insert_run,
    launch,
    run_row,
    s,
    snapshot,
    steps_of,
)

T1 = T0 + s(5)
#: A taken run is compared with a fresh read of its row on every column it returns (SQLite's
#: RETURNING has read a wrong value of an expression on a table with triggers).
_TAKEN = tuple(column.name for column in Run.__table__.c if column.name != "workflow")


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, unit_databases: Databases
) -> Iterator[Settings]:
    """One database for the table-driven tests below; each case launches its own run."""
    built = unit_databases.take(tmp_path_factory.mktemp("transitions"), "t")
    yield built
    unit_databases.give_back(built)


def _reason(to: RunStatus) -> StopReason | None:
    return sorted(STOP_REASONS[to])[0] if to in RUN_TERMINAL else None


def _run_in(settings: Settings, status: RunStatus, steps: int = 1) -> str:
    """A run in ``status`` written through the ORM (scaffolding, not a transition under test)."""
    return insert_run(settings, status.value, steps=steps)


def _step(session: Session, run_id: str, index: int = 0) -> Step:
    step = session.scalars(select(Step).where(Step.run_id == run_id, Step.index == index)).one()
    return step


# -- runs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "to"),
    [(a, b) for a, b in product(RunStatus, RunStatus) if b in RUN_TRANSITIONS[a]],
)
def test_allowed_run_transition_journals_one_event(
    shared: Settings, source: RunStatus, to: RunStatus
) -> None:
    run_id = _run_in(shared, source)
    before = events_of(shared, run_id)
    with session_scope(shared.database_url) as session:
        transition_run(session, run_id, to, cause="test move", now=T1, stop_reason=_reason(to))
    row = run_row(shared, run_id)
    assert row.status == to.value
    assert row.updated_at == T1
    new = events_of(shared, run_id)[len(before) :]
    assert [(e.step_id, e.from_status, e.to_status, e.cause, e.at) for e in new] == [
        (None, source.value, to.value, "test move", T1)
    ]
    if to in RUN_TERMINAL:
        assert row.finished_at == T1
        assert row.deadline_at is None
        assert row.stop_reason == _reason(to)
        assert new[0].stop_reason == _reason(to)
    else:
        assert row.finished_at is None
        assert row.stop_reason is None
    if to is RunStatus.RUNNING:
        assert row.started_at is not None


@pytest.mark.parametrize(
    ("source", "to"),
    [(a, b) for a, b in product(RunStatus, RunStatus) if b not in RUN_TRANSITIONS[a]],
)
def test_illegal_run_transition_raises_and_writes_nothing(
    shared: Settings, source: RunStatus, to: RunStatus
) -> None:
    run_id = _run_in(shared, source)
    before = snapshot(shared, run_id)
    with (
        pytest.raises(IllegalTransition) as caught,
        session_scope(shared.database_url) as session,
    ):
        transition_run(session, run_id, to, cause="nope", now=T1, stop_reason=_reason(to))
    assert (caught.value.current, caught.value.target) == (source.value, to.value)
    assert snapshot(shared, run_id) == before


def test_started_at_is_kept_when_a_run_resumes(settings: Settings) -> None:
    run_id = launch(settings)
    with session_scope(settings.database_url) as session:
        transition_run(session, run_id, RunStatus.RUNNING, cause="start", now=T1)
        transition_run(session, run_id, RunStatus.WAITING, cause="effects", now=T1 + s(1))
        transition_run(session, run_id, RunStatus.RUNNING, cause="next step", now=T1 + s(2))
    assert run_row(settings, run_id).started_at == T1


def test_expect_narrows_the_allowed_sources(settings: Settings) -> None:
    run_id = _run_in(settings, RunStatus.RUNNING)
    before = snapshot(settings, run_id)
    with pytest.raises(IllegalTransition), session_scope(settings.database_url) as session:
        transition_run(
            session, run_id, RunStatus.CANCELLING, cause="x", now=T1, expect=[RunStatus.PARKED]
        )
    assert snapshot(settings, run_id) == before


@pytest.mark.parametrize(
    ("to", "reason", "problem"),
    [
        (RunStatus.FAILED, StopReason.COMPLETED, "does not go with"),
        (RunStatus.FAILED, None, "does not go with"),
        (RunStatus.PARKED, StopReason.PARK_EXPIRED, "only a terminal status"),
    ],
)
def test_a_stop_reason_must_fit_the_target(
    settings: Settings, to: RunStatus, reason: StopReason | None, problem: str
) -> None:
    run_id = _run_in(settings, RunStatus.RUNNING)
    before = snapshot(settings, run_id)
    with (
        pytest.raises(ValueError, match=problem),
        session_scope(settings.database_url) as session,
    ):
        transition_run(session, run_id, to, cause="x", now=T1, stop_reason=reason)
    assert snapshot(settings, run_id) == before


def test_unknown_run_is_not_found(settings: Settings) -> None:
    with pytest.raises(RunNotFound), session_scope(settings.database_url) as session:
        transition_run(session, "no-such-run", RunStatus.RUNNING, cause="x", now=T1)


_TARGETS = st.lists(st.sampled_from(sorted(RunStatus)), min_size=1, max_size=8)


@PROPERTY
@given(targets=_TARGETS)
def test_a_terminal_run_is_final_whatever_comes_next(
    settings: Settings, targets: list[RunStatus]
) -> None:
    run_id = insert_run(settings)
    status = RunStatus.QUEUED
    before = snapshot(settings, run_id)
    for number, to in enumerate(targets):
        allowed = to in RUN_TRANSITIONS[status]
        try:
            with session_scope(settings.database_url) as session:
                transition_run(
                    session, run_id, to, cause="move", now=T0 + s(number), stop_reason=_reason(to)
                )
        except IllegalTransition:
            assert not allowed, f"{status} -> {to} is in the table but was refused"
            assert snapshot(settings, run_id) == before
            continue
        assert allowed, f"{status} -> {to} is not in the table but was written"
        status = to
        after = snapshot(settings, run_id)
        assert after["run"]["status"] == to.value
        assert len(after["events"]) == len(before["events"]) + 1
        before = after
    if status in RUN_TERMINAL:
        for to in RunStatus:
            with pytest.raises(IllegalTransition), session_scope(settings.database_url) as session:
                transition_run(session, run_id, to, cause="late", now=T1, stop_reason=_reason(to))
        assert snapshot(settings, run_id) == before


# -- steps ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "to"),
    [(a, b) for a, b in product(StepStatus, StepStatus)],
)
def test_step_transition_follows_the_table(
    shared: Settings, source: StepStatus, to: StepStatus
) -> None:
    run_id = _run_in(shared, RunStatus.RUNNING)
    force_step(shared, run_id, 0, status=source.value)
    before = snapshot(shared, run_id)
    if to not in STEP_TRANSITIONS[source]:
        with pytest.raises(IllegalTransition), session_scope(shared.database_url) as session:
            transition_step(session, _step(session, run_id), to, cause="nope", now=T1)
        assert snapshot(shared, run_id) == before
        return
    with session_scope(shared.database_url) as session:
        transition_step(session, _step(session, run_id), to, cause="move", now=T1)
    step = steps_of(shared, run_id)[0]
    assert step.status == to.value
    new = events_of(shared, run_id)[len(before["events"]) :]
    assert [(e.step_id, e.from_status, e.to_status, e.cause) for e in new] == [
        ("s0", source.value, to.value, "move")
    ]
    assert (step.finished_at == T1) is (to in STEP_TERMINAL)


# -- touch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", sorted(RUN_TERMINAL))
def test_touch_run_and_take_run_do_not_write_a_terminal_row(
    settings: Settings, status: RunStatus
) -> None:
    run_id = _run_in(settings, RunStatus.RUNNING)
    with session_scope(settings.database_url) as session:
        transition_run(session, run_id, status, cause="end", now=T1, stop_reason=_reason(status))
    before = snapshot(settings, run_id)
    with session_scope(settings.database_url) as session:
        assert touch_run(session, run_id, T1 + s(9), heartbeat_at=T1 + s(9), rearms=7) is False
        assert take_run(session, run_id, T1 + s(9), cancel_requested_at=T1 + s(9)) is None
        assert take_run(session, "no-such-run", T1 + s(9)) is None
    assert snapshot(settings, run_id) == before


def test_touch_run_writes_a_live_row_without_a_journal_entry(settings: Settings) -> None:
    run_id = launch(settings)
    before = events_of(settings, run_id)
    with session_scope(settings.database_url) as session:
        assert touch_run(session, run_id, T1, heartbeat_at=T1) is True
    row = run_row(settings, run_id)
    assert (row.heartbeat_at, row.updated_at, row.status) == (T1, T1, RunStatus.QUEUED.value)
    assert len(events_of(settings, run_id)) == len(before)


def test_touch_run_of_an_unknown_run_is_false(settings: Settings) -> None:
    with session_scope(settings.database_url) as session:
        assert touch_run(session, "no-such-run", T1, heartbeat_at=T1) is False


def test_take_run_returns_the_run_as_written_and_writes_a_first_value_once(
    settings: Settings,
) -> None:
    run_id = launch(settings)
    before = events_of(settings, run_id)
    with session_scope(settings.database_url) as session:
        taken = take_run(session, run_id, T1, cancel_requested_at=T1)
        assert taken is not None
        seen = {column: getattr(taken, column) for column in _TAKEN}
    row = run_row(settings, run_id)
    assert seen == {column: getattr(row, column) for column in _TAKEN}
    assert (row.updated_at, row.cancel_requested_at) == (T1, T1)
    with session_scope(settings.database_url) as session:
        again = take_run(session, run_id, T1 + s(1), cancel_requested_at=T1 + s(1))
        assert again is not None and again.cancel_requested_at == T1
        assert again.updated_at == T1 + s(1)
    assert len(events_of(settings, run_id)) == len(before)


def test_touch_step_does_not_write_a_terminal_step(settings: Settings) -> None:
    run_id = launch(settings)
    with session_scope(settings.database_url) as session:
        transition_step(session, _step(session, run_id), StepStatus.SKIPPED, cause="x", now=T1)
    before = snapshot(settings, run_id)
    with session_scope(settings.database_url) as session:
        assert touch_step(session, _step(session, run_id), T1, output={"late": True}) is False
    assert snapshot(settings, run_id) == before


# -- end_run -------------------------------------------------------------------------------

_CLOSE_CASES: list[tuple[RunStatus, StopReason, StepStatus, StepStatus]] = [
    # (run end, stop reason, end of the started step, end of the pending steps)
    (RunStatus.FAILED, StopReason.STEP_FAILED, StepStatus.FAILED, StepStatus.SKIPPED),
    (RunStatus.CANCELLED, StopReason.CANCEL_REQUESTED, StepStatus.CANCELLED, StepStatus.CANCELLED),
    (RunStatus.TIMED_OUT, StopReason.STEP_TIMEOUT, StepStatus.TIMED_OUT, StepStatus.SKIPPED),
    (RunStatus.INTERRUPTED, StopReason.HEARTBEAT_LOST, StepStatus.CANCELLED, StepStatus.SKIPPED),
]


@pytest.mark.parametrize(("to", "reason", "started_end", "pending_end"), _CLOSE_CASES)
@pytest.mark.parametrize("started", [StepStatus.RUNNING, StepStatus.PARKED])
def test_end_run_ends_every_live_step_in_one_go(
    settings: Settings,
    to: RunStatus,
    reason: StopReason,
    started_end: StepStatus,
    pending_end: StepStatus,
    started: StepStatus,
) -> None:
    run_id = _run_in(settings, RunStatus.RUNNING, steps=4)
    force_step(settings, run_id, 0, status=StepStatus.COMPLETED.value)
    force_step(settings, run_id, 1, status=started.value)
    before = events_of(settings, run_id)
    assert run_row(settings, run_id).status == RunStatus.RUNNING.value
    with session_scope(settings.database_url) as session:
        end_run(
            session,
            settings,
            run_id,
            to,
            stop_reason=reason,
            cause="closing",
            now=T1,
            error="why",
            step_error="step why",
        )
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason, run.error, run.finished_at) == (
        to.value,
        reason.value,
        "why",
        T1,
    )
    assert [step.status for step in steps_of(settings, run_id)] == [
        StepStatus.COMPLETED.value,
        started_end.value,
        pending_end.value,
        pending_end.value,
    ]
    new = events_of(settings, run_id)[len(before) :]
    assert [(e.step_id, e.from_status, e.to_status) for e in new] == [
        (None, RunStatus.RUNNING.value, to.value),  # the status the run left
        ("s1", started.value, started_end.value),
        ("s2", StepStatus.PENDING.value, pending_end.value),
        ("s3", StepStatus.PENDING.value, pending_end.value),
    ]
    assert {(e.at, e.cause) for e in new} == {(T1, "closing")}
    assert steps_of(settings, run_id)[1].error == "step why"


def test_end_run_is_one_transaction(settings: Settings) -> None:
    """If any step cannot be ended, the run's own transition is rolled back with it."""
    run_id = _run_in(settings, RunStatus.RUNNING, steps=2)
    force_step(settings, run_id, 0, status=StepStatus.RUNNING.value)
    before = snapshot(settings, run_id)
    # ``completed`` ends unfinished steps as ``skipped``, which a running step cannot become.
    with pytest.raises(IllegalTransition), session_scope(settings.database_url) as session:
        end_run(
            session,
            settings,
            run_id,
            RunStatus.COMPLETED,
            stop_reason=StopReason.COMPLETED,
            cause="closing",
            now=T1,
        )
    assert snapshot(settings, run_id) == before


def test_end_run_of_a_terminal_run_raises_and_writes_nothing(settings: Settings) -> None:
    run_id = _run_in(settings, RunStatus.RUNNING)
    with session_scope(settings.database_url) as session:
        end_run(
            session,
            settings,
            run_id,
            RunStatus.FAILED,
            stop_reason=StopReason.STEP_FAILED,
            cause="first",
            now=T1,
        )
    before = snapshot(settings, run_id)
    with pytest.raises(IllegalTransition), session_scope(settings.database_url) as session:
        end_run(
            session,
            settings,
            run_id,
            RunStatus.CANCELLED,
            stop_reason=StopReason.CANCEL_REQUESTED,
            cause="second",
            now=T1 + s(1),
        )
    assert snapshot(settings, run_id) == before


def test_end_run_passes_the_claim_to_the_next_queued_run(settings: Settings) -> None:
    holder = launch(settings, concurrency_key="k")
    waiting = launch(settings, concurrency_key="k", on_conflict=concurrency.OnConflict.ENQUEUE)
    assert (run_row(settings, holder).concurrency, run_row(settings, waiting).concurrency) == (
        ConcurrencyState.HOLDING,
        ConcurrencyState.QUEUED,
    )
    dispatcher = RecordingDispatcher()

    def work(session: Session) -> Done[Followups]:
        then = end_run(
            session,
            settings,
            holder,
            RunStatus.FAILED,
            stop_reason=StopReason.STEP_FAILED,
            cause="done",
            now=T1,
        )
        assert dispatcher.chains == [], "the chain must not be sent before the commit"
        return Done(then, then)

    then = Executor(settings, dispatcher)(work)
    assert [plan.run_id for plan in then.chains] == [waiting]
    assert run_row(settings, holder).concurrency is None
    assert run_row(settings, waiting).concurrency == ConcurrencyState.HOLDING
    assert [plan.run_id for plan in dispatcher.chains] == [waiting]
    assert dispatcher.chains[0].task_ids == run_row(settings, waiting).task_ids


# -- compare-and-set under a concurrent writer ----------------------------------------------


class _Scalar:
    def __init__(self, value: Any) -> None:
        self.value = value

    def scalar(self) -> Any:
        return self.value


def test_a_move_that_lost_a_race_to_one_that_no_longer_allows_it_is_refused(
    settings: Settings,
) -> None:
    """No status is read before the write: the compare-and-set on the allowed sources is the
    decision, and a writer that another moved past them writes nothing."""
    run_id = _run_in(settings, RunStatus.RUNNING)
    with session_scope(settings.database_url) as session:
        transition_run(session, run_id, RunStatus.CANCELLING, cause="a cancel came first", now=T1)
    before = events_of(settings, run_id)
    with (
        pytest.raises(IllegalTransition) as caught,
        session_scope(settings.database_url) as session,
    ):
        transition_run(session, run_id, RunStatus.PARKED, cause="park", now=T1)
    assert caught.value.current == RunStatus.CANCELLING.value
    assert run_row(settings, run_id).status == RunStatus.CANCELLING.value
    assert len(events_of(settings, run_id)) == len(before)


def test_a_move_that_lost_a_race_is_journalled_from_the_status_really_left(
    settings: Settings,
) -> None:
    run_id = _run_in(settings, RunStatus.RUNNING)
    with session_scope(settings.database_url) as session:
        transition_run(session, run_id, RunStatus.WAITING, cause="effects came first", now=T1)
    before = events_of(settings, run_id)
    with session_scope(settings.database_url) as session:
        transition_run(
            session,
            run_id,
            RunStatus.COMPLETED,
            cause="done",
            now=T1,
            stop_reason=StopReason.COMPLETED,
        )
    new = events_of(settings, run_id)[len(before) :]
    assert [(e.from_status, e.to_status, e.cause) for e in new] == [
        ("waiting", "completed", "done")
    ]


def test_writers_that_move_one_run_at_once_journal_one_path_of_legal_moves(
    settings: Settings,
) -> None:
    """Writers on connections of their own move one run back and forth at the same time. Each
    move either goes on from the status the run really has or writes nothing: the journal is
    one path of legal moves from ``running``, and it ends where the run is. (PostgreSQL: a
    writer that waited on the row lock checks the row again once the other commits; SQLite
    serialises the writers.)"""
    run_id = _run_in(settings, RunStatus.RUNNING)
    targets = [RunStatus.RUNNING, RunStatus.WAITING, RunStatus.PARKED] * 2
    together = threading.Barrier(len(targets))
    moved: list[RunStatus] = []
    errors: list[BaseException] = []

    def move(to: RunStatus) -> None:
        try:
            together.wait(10)
            for _ in range(15):
                try:
                    with session_scope(settings.database_url) as session:
                        transition_run(session, run_id, to, cause="race", now=T1)
                    moved.append(to)
                except IllegalTransition:
                    pass
        except BaseException as exc:
            errors.append(exc)

    writers = [threading.Thread(target=move, args=(to,)) for to in targets]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert errors == []
    path = [(e.from_status, e.to_status) for e in events_of(settings, run_id)]
    assert sorted(to for _, to in path) == sorted(to.value for to in moved) and moved
    assert [source for source, _ in path] == [RunStatus.RUNNING.value, *[to for _, to in path][:-1]]
    assert all(RunStatus(to) in RUN_TRANSITIONS[RunStatus(source)] for source, to in path)
    assert run_row(settings, run_id).status == path[-1][1]


def _lock_waits(settings: Settings) -> int:
    """Sessions of this database waiting on a lock (PostgreSQL)."""
    with session_scope(settings.database_url) as session:
        return int(
            session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            )
            or 0
        )


@pytest.mark.postgresql_only(
    reason="watches a writer wait on PostgreSQL's row lock (pg_stat_activity); SQLite "
    "serialises writers on its file, where no such wait can be seen"
)
def test_a_move_that_waited_on_an_uncommitted_move_checks_the_row_again(
    settings: Settings,
) -> None:
    """A park that reaches the row while a cancel's move holds it uncommitted waits for it,
    then finds ``cancelling`` (which it may not leave for ``parked``) and writes nothing."""
    run_id = _run_in(settings, RunStatus.RUNNING)
    outcome: list[BaseException | None] = []

    def park() -> None:
        try:
            with session_scope(settings.database_url) as session:
                transition_run(session, run_id, RunStatus.PARKED, cause="park", now=T1)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    parking = threading.Thread(target=park)
    with session_scope(settings.database_url) as session:
        transition_run(session, run_id, RunStatus.CANCELLING, cause="cancel", now=T1)
        parking.start()
        wait_for(lambda: _lock_waits(settings), timeout=10, what="the park to wait on the row")
    parking.join(10)
    [refused] = outcome
    assert isinstance(refused, IllegalTransition), refused
    assert (refused.current, refused.target) == ("cancelling", "parked")
    assert [(e.from_status, e.to_status) for e in events_of(settings, run_id)] == [
        ("running", "cancelling")
    ]


def test_a_live_guard_is_written_into_the_statement_not_expanded_per_execution() -> None:
    """The guards' status lists are constants: compiled once, with no expanding parameter
    for SQLAlchemy to render again at each execution; anything but a plain name is refused."""
    guard = constant_in(Run.status, sorted(status.value for status in RUN_LIVE))
    sql = str(select(Run.id).where(guard).compile(dialect=postgresql.dialect()))
    assert "POSTCOMPILE" not in sql
    assert "runs.status IN ('cancelling', 'parked', 'queued', 'running', 'waiting')" in sql
    with pytest.raises(ValueError, match="not constant names"):
        constant_in(Run.status, ["running', 'x"])
