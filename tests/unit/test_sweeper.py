"""``Sweeper.sweep(now)`` with explicit times: re-arm, interrupt, park expiry, enforced cancel,
idempotent passes and the liveness stamp. The dispatcher records instead of sending."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import select, update

from orchestration.core import deadlines
from orchestration.core.db import session_scope
from orchestration.core.models import Run, SweeperBeat
from orchestration.core.settings import Settings
from orchestration.core.states import (
    ConcurrencyState,
    ParkReason,
    RunStatus,
    StepStatus,
    StopReason,
)
from orchestration.execution import Halt, Poll, Stepper
from orchestration.providers.scripted import ScriptedProvider
from orchestration.runs import cancellation, closing, concurrency, turns
from orchestration.runtime.executor import Executor
from orchestration.runtime.liveness import last_pass
from orchestration.upkeep.sweeper import SWEEPER_NAME, Sweeper
from tests.unit.support import (
    T0,
    Clock,
    RecordingDispatcher,
    events_of,
    launch,
    run_row,
    s,
    snapshot,
    step_spec,
    steps_of,
    workflow,
)

ACTIONS = (
    "cancels_enforced",
    "promoted",
    "parks_expired",
    "rearmed",
    "interrupted",
    "deadlines_exceeded",
    "errors",
)


def _did(report: dict[str, Any]) -> dict[str, int]:
    """The non-zero action counts of a sweep report."""
    return {name: report[name] for name in ACTIONS if report[name]}


@pytest.fixture
def dispatcher() -> RecordingDispatcher:
    return RecordingDispatcher()


@pytest.fixture
def sweeper(settings: Settings, dispatcher: RecordingDispatcher) -> Sweeper:
    return Sweeper(settings, Executor(settings, dispatcher))


def _started(settings: Settings, *, states: list[list[Any]] | None = None, polls: int = 1) -> str:
    """A run launched at T0 whose step task ran ``polls`` times at T0 (turn started)."""
    options = {"states": states or [["running"]]}
    run_id = launch(settings, workflow(step_spec(with_=options)), now=T0)
    stepper = Stepper(settings, Executor(settings, None), clock=Clock(T0))
    tick = 0
    for _ in range(polls):
        outcome = stepper.advance(run_id, 0, tick)
        assert isinstance(outcome, Poll), outcome
        tick = outcome.tick
    return run_id


def _dead(settings: Settings, since: datetime) -> datetime:
    """The first moment a heartbeat stamped at ``since`` counts as dead (plus a second)."""
    return since + s(settings.heartbeat_timeout + 1)


# -- dead heartbeats -----------------------------------------------------------------------


def test_a_fresh_run_is_left_alone(
    settings: Settings, sweeper: Sweeper, dispatcher: RecordingDispatcher
) -> None:
    run_id = _started(settings)
    before = snapshot(settings, run_id)
    report = sweeper.sweep(T0 + s(settings.heartbeat_timeout))
    assert (report["live"], _did(report)) == (1, {})
    assert snapshot(settings, run_id) == before
    assert (dispatcher.chains, dispatcher.revoked) == ([], [])


def test_a_dead_heartbeat_is_rearmed_with_the_steps_current_tick(
    settings: Settings, sweeper: Sweeper, dispatcher: RecordingDispatcher
) -> None:
    run_id = _started(settings, polls=3)
    [step] = steps_of(settings, run_id)
    assert step.polls == 3
    now = _dead(settings, T0)
    assert _did(sweeper.sweep(now)) == {"rearmed": 1}
    run = run_row(settings, run_id)
    assert (run.rearms, run.heartbeat_at) == (1, now)
    assert (run.status, run.park_reason, run.parked_since) == (
        RunStatus.PARKED.value,
        ParkReason.PLATFORM_INTERRUPT.value,
        now,
    )
    assert steps_of(settings, run_id)[0].status == StepStatus.PARKED.value
    [plan] = dispatcher.chains
    assert (plan.run_id, [(link.index, link.tick) for link in plan.links]) == (run_id, [(0, 3)])
    assert run.task_ids[-1] == plan.task_ids[0]
    assert run.deadline_at is not None and run.deadline_at > now

    # The re-armed message wins the fence; a late redelivery of the old one is a no-op.
    stepper = Stepper(settings, Executor(settings, None), clock=Clock(now + s(1)))
    assert stepper.advance(run_id, 0, 2) == Halt("duplicate or stale delivery")
    assert isinstance(stepper.advance(run_id, 0, 3), Poll)
    assert run_row(settings, run_id).status == RunStatus.RUNNING.value  # resumed


def test_rearms_are_bounded_then_the_run_is_interrupted(
    settings: Settings, sweeper: Sweeper, dispatcher: RecordingDispatcher
) -> None:
    run_id = _started(settings)
    now = T0
    for expected in range(1, settings.max_rearms + 1):
        now = _dead(settings, now)
        assert _did(sweeper.sweep(now)) == {"rearmed": 1}
        assert run_row(settings, run_id).rearms == expected
    assert len(dispatcher.chains) == settings.max_rearms

    now = _dead(settings, now)
    assert _did(sweeper.sweep(now)) == {"interrupted": 1}
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason, run.finished_at) == ("interrupted", "heartbeat_lost", now)
    assert [step.status for step in steps_of(settings, run_id)] == ["cancelled"]
    assert dispatcher.revoked == [(run.task_ids, True)]
    _stop_was_handed_off(settings, dispatcher, run_id, now)
    assert len(dispatcher.chains) == settings.max_rearms, "no re-arm after the last one"
    assert sweeper.sweep(_dead(settings, now))["live"] == 0


def test_a_queued_run_that_never_started_is_rearmed(
    settings: Settings, sweeper: Sweeper, dispatcher: RecordingDispatcher
) -> None:
    run_id = launch(settings, now=T0)
    assert _did(sweeper.sweep(_dead(settings, T0))) == {"rearmed": 1}
    run = run_row(settings, run_id)
    assert (run.status, run.rearms) == (RunStatus.QUEUED.value, 1)
    [plan] = dispatcher.chains
    assert [(link.index, link.tick) for link in plan.links] == [(0, 0)]


# -- parks ---------------------------------------------------------------------------------


def _parked_for_a_human(settings: Settings) -> str:
    run_id = _started(settings, states=[["input_required"]])
    outcome = Stepper(settings, Executor(settings, None), clock=Clock(T0)).advance(run_id, 0, 1)
    assert outcome == Halt("parked for a human answer")
    return run_id


def test_a_human_park_is_not_rearmed_while_within_its_budget(
    settings: Settings, sweeper: Sweeper, dispatcher: RecordingDispatcher
) -> None:
    run_id = _parked_for_a_human(settings)
    before = snapshot(settings, run_id)
    assert _did(sweeper.sweep(_dead(settings, T0))) == {}
    assert _did(sweeper.sweep(T0 + s(settings.park_budget_human))) == {}
    assert snapshot(settings, run_id) == before
    assert dispatcher.chains == []


def test_a_human_park_past_its_budget_times_out(
    settings: Settings, sweeper: Sweeper, dispatcher: RecordingDispatcher
) -> None:
    run_id = _parked_for_a_human(settings)
    now = T0 + s(settings.park_budget_human + 1)
    assert _did(sweeper.sweep(now)) == {"parks_expired": 1}
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("timed_out", "park_expired")
    assert [step.status for step in steps_of(settings, run_id)] == ["timed_out"]
    assert run.error is not None and "human park" in run.error
    assert dispatcher.revoked == [(run.task_ids, True)]


def test_a_polled_park_past_its_budget_times_out_before_any_rearm(
    settings: Settings, sweeper: Sweeper
) -> None:
    run_id = _started(settings)
    sweeper.sweep(_dead(settings, T0))  # re-armed: parked platform_interrupt
    parked_since = run_row(settings, run_id).parked_since
    assert parked_since is not None
    now = parked_since + s(settings.park_budget_platform_interrupt + 1)
    assert _did(sweeper.sweep(now)) == {"parks_expired": 1}
    assert run_row(settings, run_id).stop_reason == "park_expired"


# -- cancel enforcement --------------------------------------------------------------------


def test_an_unhonoured_cancel_is_enforced_after_the_grace_and_a_dead_heartbeat(
    settings: Settings, sweeper: Sweeper, dispatcher: RecordingDispatcher
) -> None:
    run_id = _started(settings)
    assert cancellation.request(Executor(settings, dispatcher), settings, run_id, now=T0, by="test")
    before = snapshot(settings, run_id)
    assert _did(sweeper.sweep(T0 + s(settings.cancel_grace + 1))) == {}, "heartbeat alive"
    assert snapshot(settings, run_id) == before

    now = _dead(settings, T0)
    assert now > T0 + s(settings.cancel_grace)
    assert _did(sweeper.sweep(now)) == {"cancels_enforced": 1}
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("cancelled", "cancel_enforced")
    assert [step.status for step in steps_of(settings, run_id)] == ["cancelled"]
    assert dispatcher.revoked == [(run.task_ids, True)]
    _stop_was_handed_off(settings, dispatcher, run_id, now)


def test_a_cancelling_run_is_never_rearmed(
    settings_factory: Callable[..., Settings], dispatcher: RecordingDispatcher
) -> None:
    settings = settings_factory(cancel_grace=600)
    run_id = _started(settings)
    assert cancellation.request(Executor(settings, dispatcher), settings, run_id, now=T0, by="test")
    report = Sweeper(settings, Executor(settings, dispatcher)).sweep(_dead(settings, T0))
    assert _did(report) == {}
    assert dispatcher.chains == []
    assert run_row(settings, run_id).status == RunStatus.CANCELLING.value


# -- concurrency keys ----------------------------------------------------------------------


def test_a_run_queued_behind_a_vanished_holder_is_promoted(
    settings: Settings, sweeper: Sweeper, dispatcher: RecordingDispatcher
) -> None:
    holder = launch(settings, concurrency_key="k", now=T0)
    waiting = launch(
        settings, concurrency_key="k", on_conflict=concurrency.OnConflict.ENQUEUE, now=T0 + s(1)
    )
    assert _did(sweeper.sweep(T0 + s(2))) == {}
    # The holder loses its claim without a promotion (as a displacing launch leaves it).
    with session_scope(settings.database_url) as session:
        then = closing.end_run(
            session,
            settings,
            holder,
            RunStatus.FAILED,
            stop_reason=StopReason.STEP_FAILED,
            cause="test",
            now=T0 + s(2),
            promote=False,
        )
    assert then.chains == (), "no promotion: nothing armed"  # its followups are not carried out
    assert _did(sweeper.sweep(T0 + s(3))) == {"promoted": 1}
    assert run_row(settings, waiting).concurrency == ConcurrencyState.HOLDING
    assert [plan.run_id for plan in dispatcher.chains] == [waiting]


# -- idempotence and liveness --------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["rearm", "interrupt", "park", "cancel"])
def test_two_sweeps_at_the_same_now_journal_each_transition_once(
    settings: Settings, sweeper: Sweeper, dispatcher: RecordingDispatcher, scenario: str
) -> None:
    now = _dead(settings, T0)
    if scenario == "park":
        run_id = _parked_for_a_human(settings)
        now = T0 + s(settings.park_budget_human + 1)
    else:
        run_id = _started(settings)
    if scenario == "interrupt":
        for _ in range(settings.max_rearms):
            sweeper.sweep(now)
            now = _dead(settings, now)
    if scenario == "cancel":
        cancellation.request(Executor(settings, dispatcher), settings, run_id, now=T0, by="test")
    first = sweeper.sweep(now)
    after_first = snapshot(settings, run_id)
    chains = len(dispatcher.chains)
    second = sweeper.sweep(now)
    assert sum(first[name] for name in ACTIONS) == 1
    assert _did(second) == {}
    assert snapshot(settings, run_id) == after_first
    assert len(dispatcher.chains) == chains
    journal = [(e.step_id, e.from_status, e.to_status) for e in events_of(settings, run_id)]
    assert len(journal) == len(set(journal)), f"a transition was journalled twice: {journal}"


def test_the_sweeper_stamps_its_liveness_row(settings: Settings, sweeper: Sweeper) -> None:
    assert last_pass(settings) is None
    first = sweeper.sweep(T0)
    beat = last_pass(settings)
    assert beat is not None
    assert (beat.name, beat.last_pass_at, beat.passes) == (SWEEPER_NAME, T0, 1)
    assert beat.last_report["at"] == first["at"] == T0.isoformat()
    sweeper.sweep(T0 + s(5))
    sweeper.sweep(T0 + s(2))  # a late beat never moves the stamp back
    with session_scope(settings.database_url) as session:
        beats = session.scalars(select(SweeperBeat)).all()
        assert [(b.passes, b.last_pass_at) for b in beats] == [(3, T0 + s(5))]


# -- the deadline pass ---------------------------------------------------------------------


def test_a_stalled_run_past_its_deadline_is_rearmed_not_closed(
    settings: Settings, sweeper: Sweeper
) -> None:
    # A dead heartbeat is the re-arm pass's to handle; the deadline pass is only a backstop.
    run_id = _started(settings)
    now = _dead(settings, T0) + s(deadlines.slack_seconds(settings))
    run = run_row(settings, run_id)
    assert run.deadline_at is not None and now > run.deadline_at
    report = sweeper.sweep(now)
    assert _did(report) == {"rearmed": 1}


def test_a_live_run_past_its_deadline_is_closed_deadline_exceeded(
    settings: Settings, sweeper: Sweeper
) -> None:
    # The heartbeat is fresh but the step's own timeout went unenforced (an overloaded
    # worker never ran the poll that would have ended it): the backstop closes it.
    run_id = _started(settings)
    run = run_row(settings, run_id)
    assert run.deadline_at is not None
    now = run.deadline_at + s(1)
    with session_scope(settings.database_url) as session:
        session.execute(update(Run).where(Run.id == run_id).values(heartbeat_at=now))
    report = sweeper.sweep(now)
    assert _did(report) == {"deadlines_exceeded": 1}
    assert run_row(settings, run_id).stop_reason == "deadline_exceeded"


def test_a_run_in_effects_past_its_step_timeout_states_a_deadline_ahead_of_its_heartbeat(
    settings_factory: Callable[..., Settings], dispatcher: RecordingDispatcher
) -> None:
    settings = settings_factory(effect_attempts=5, effect_backoff=2.0)
    definition = workflow(
        step_spec(timeout=1, with_={"states": [["completed"]], "checkpoint_fails": True})
    )
    clock = Clock(T0)
    run_id = launch(settings, definition, now=clock())
    stepper = Stepper(settings, Executor(settings, None), clock=clock)
    outcome = stepper.advance(run_id, 0, 0)
    while isinstance(outcome, Poll) and clock() < T0 + s(6):
        clock.advance(outcome.countdown)
        outcome = stepper.advance(run_id, 0, outcome.tick)
    run = run_row(settings, run_id)
    assert run.status == RunStatus.WAITING.value  # effects still retrying
    assert run.deadline_at is not None and run.heartbeat_at is not None
    # Effects are bounded by their attempts, not by the step's timeout: the stated deadline
    # is the heartbeat's, so it lies ahead of a fresh heartbeat and a sweep leaves it be.
    assert run.deadline_at > run.heartbeat_at + s(settings.heartbeat_timeout)
    report = Sweeper(settings, Executor(settings, dispatcher)).sweep(run.heartbeat_at + s(1))
    assert _did(report) == {}
    assert run_row(settings, run_id).status == RunStatus.WAITING.value


def _stop_was_handed_off(settings: Settings, dispatcher: Any, run_id: str, now: datetime) -> None:
    """The pass made no provider call: the turn's stop is pending and sent to the stop task,
    which then cancels it."""
    assert dispatcher.stops == [(run_id, 0)]
    [turn] = ScriptedProvider(settings).turns(f"{run_id}:")
    assert turn["cancel_requested_at"] is None
    assert turns.attempt(Executor(settings, None), settings, run_id, 0, now) is None
    [turn] = ScriptedProvider(settings).turns(f"{run_id}:")
    assert turn["cancel_requested_at"] is not None


# -- each owner's share of a pass (issue 30) -----------------------------------------------


def test_one_owners_backlog_takes_its_share_and_another_owners_run_is_swept_first_pass(
    settings_factory: Callable[..., Settings], dispatcher: RecordingDispatcher
) -> None:
    settings = settings_factory(sweep_actions_per_owner=5)
    backlog = [launch(settings, owner="busy", now=T0) for _ in range(23)]
    plain = launch(settings, owner="plain", now=T0 + s(0.5))  # touched last, read last
    sweeper = Sweeper(settings, Executor(settings, dispatcher))
    now = _dead(settings, T0 + s(0.5))

    first = sweeper.sweep(now)
    assert (first["rearmed"], first["deferred"]) == (6, 18)
    assert run_row(settings, plain).rearms == 1
    assert sum(run_row(settings, run_id).rearms for run_id in backlog) == 5

    passes = [sweeper.sweep(now)["rearmed"] for _ in range(4)]
    assert passes == [5, 5, 5, 3]  # the backlog goes on, a share a pass, until it is done
    assert {run_row(settings, run_id).rearms for run_id in backlog} == {1}


def test_a_pass_past_its_budget_defers_the_rest(
    settings: Settings, dispatcher: RecordingDispatcher
) -> None:
    for owner in ("a", "b"):
        launch(settings, owner=owner, now=T0)
    report = Sweeper(settings, Executor(settings, dispatcher), budget=0.0).sweep(
        _dead(settings, T0)
    )
    assert (report["rearmed"], report["deferred"]) == (0, 2)
