"""``Stepper.advance`` driven directly: one execution per call, on SQLite, with the scripted
provider. The Celery task body would turn each outcome into a retry, a return or a stop; here
the test plays the task body and feeds each :class:`Poll`'s tick into the next call."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from orchestration.core import deadlines
from orchestration.core.db import session_scope, utcnow
from orchestration.core.models import Checkpoint, Effect
from orchestration.core.settings import Settings
from orchestration.core.states import EffectStatus, ParkReason, RunStatus, StepStatus, StopReason
from orchestration.execution import Halt, Outcome, Poll, Proceed, Stepper
from orchestration.providers.base import ProviderStatus, TurnRef, TurnRequest
from orchestration.providers.scripted import TURNS, ScriptedProvider, store_url
from orchestration.runs import cancellation
from orchestration.runs.closing import end_run
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from tests.unit.support import (
    Clock,
    RecordingDispatcher,
    drive,
    events_of,
    launch,
    run_row,
    snapshot,
    step_spec,
    steps_of,
    workflow,
)

LONG = 30.0  # seconds a scripted state lasts unless the test ages the turn


@pytest.fixture
def clock() -> Clock:
    # The scripted provider plays turns on the real clock; the engine's clock starts there and
    # is moved by hand when a test needs a timeout or a backoff to pass.
    return Clock(utcnow())


def _stepper(settings: Settings, clock: Clock, dispatcher: Any = None) -> Stepper:
    return Stepper(
        settings, Executor(settings, dispatcher), clock=clock, worker="unit@host", pid=4242
    )


def _age_turns(settings: Settings, seconds: float) -> None:
    """Every scripted turn behaves as if it started ``seconds`` earlier."""
    with session_scope(store_url(settings)) as session:
        rows = session.execute(select(TURNS.c.key, TURNS.c.started_at)).all()
        for key, started in rows:
            if started is not None:
                session.execute(
                    update(TURNS)
                    .where(TURNS.c.key == key)
                    .values(started_at=started - timedelta(seconds=seconds))
                )


def _turns(settings: Settings, run_id: str) -> list[dict[str, Any]]:
    return ScriptedProvider(settings).turns(f"{run_id}:")


# -- fencing and halting -------------------------------------------------------------------


def test_a_duplicate_tick_halts_without_writing(settings: Settings, clock: Clock) -> None:
    run_id = launch(settings, workflow(step_spec(with_={"states": [["running"]]})), now=clock())
    stepper = _stepper(settings, clock)
    first = stepper.advance(run_id, 0, 0)
    assert first == Poll(0.1, 1)
    after_first = snapshot(settings, run_id)
    assert after_first["steps"][0]["polls"] == 1
    assert after_first["steps"][0]["worker"] == "unit@host"
    clock.advance(1)
    for stale in (0, 5):  # a redelivery of the same message, and a tick from nowhere
        assert stepper.advance(run_id, 0, stale) == Halt("duplicate or stale delivery")
        assert snapshot(settings, run_id) == after_first
    assert len(_turns(settings, run_id)) == 1


def test_a_terminal_run_halts_without_writing(settings: Settings, clock: Clock) -> None:
    run_id = launch(settings, now=clock())
    with session_scope(settings.database_url) as session:
        end_run(
            session,
            settings,
            run_id,
            RunStatus.FAILED,
            stop_reason=StopReason.STEP_FAILED,
            cause="ended elsewhere",
            now=clock(),
        )
    before = snapshot(settings, run_id)
    assert _stepper(settings, clock).advance(run_id, 0, 0) == Halt("run is failed", revoked=True)
    assert snapshot(settings, run_id) == before
    assert _turns(settings, run_id) == [], "no turn may start for a terminal run"


def test_an_unknown_run_or_step_halts(settings: Settings, clock: Clock) -> None:
    stepper = _stepper(settings, clock)
    assert stepper.advance("no-such-run", 0, 0) == Halt("no such run")
    run_id = launch(settings, now=clock())
    assert stepper.advance(run_id, 7, 0) == Halt("step already finished")


def test_a_requested_cancel_is_honoured_and_its_turn_cancelled(
    settings: Settings, clock: Clock
) -> None:
    run_id = launch(settings, workflow(step_spec(with_={"states": [["running"]]})), now=clock())
    stepper = _stepper(settings, clock)
    tick = stepper.advance(run_id, 0, 0)
    assert isinstance(tick, Poll)
    assert cancellation.request(Executor(settings, None), settings, run_id, now=clock(), by="test")
    assert run_row(settings, run_id).status == RunStatus.CANCELLING.value

    assert stepper.advance(run_id, 0, tick.tick) == Halt("cancel honoured", revoked=True)
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("cancelled", "cancel_requested")
    assert [step.status for step in steps_of(settings, run_id)] == ["cancelled"]
    [turn] = _turns(settings, run_id)
    assert turn["cancel_requested_at"] is not None
    observed = ScriptedProvider(settings).status(TurnRef(turn["key"], None, {}))
    assert observed.status is ProviderStatus.CANCELLED


def test_a_cancel_before_the_first_execution_starts_no_turn(
    settings: Settings, clock: Clock
) -> None:
    run_id = launch(settings, now=clock())
    assert cancellation.request(Executor(settings, None), settings, run_id, now=clock(), by="test")
    assert _stepper(settings, clock).advance(run_id, 0, 0) == Halt("cancel honoured", revoked=True)
    assert run_row(settings, run_id).status == RunStatus.CANCELLED.value
    assert [step.status for step in steps_of(settings, run_id)] == ["cancelled"]
    assert _turns(settings, run_id) == []


# -- the happy path ------------------------------------------------------------------------


def test_start_polls_effects_and_completes_a_two_step_run(settings: Settings, clock: Clock) -> None:
    definition = workflow(
        step_spec(
            "research",
            task="facts about {{ args.topic }}",
            with_={"states": [["running", LONG], ["idle"]], "output": {"facts": ["f1", "f2"]}},
        ),
        step_spec(
            "summarize",
            task={"summarize": "{{ steps.research.output.facts }}"},
            with_={"states": [["completed"]], "output": "summary"},
        ),
    )
    run_id = launch(settings, definition, {"topic": "tides"}, now=clock())
    stepper = _stepper(settings, clock)

    started = stepper.advance(run_id, 0, 0)
    assert started == Poll(0.1, 1)
    assert run_row(settings, run_id).status == RunStatus.RUNNING.value
    polled = stepper.advance(run_id, 0, started.tick)
    assert polled == Poll(0.1, 2)  # the turn is still running
    _age_turns(settings, LONG + 1)
    assert stepper.advance(run_id, 0, polled.tick) == Proceed()

    # An instant turn is finished in the execution that starts it: no Poll hop.
    assert drive(stepper, run_id, 1, 0) == [Proceed()]

    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason, run.result) == ("completed", "completed", "summary")
    steps = steps_of(settings, run_id)
    assert [(s.status, s.input, s.output) for s in steps] == [
        ("completed", "facts about tides", {"facts": ["f1", "f2"]}),
        ("completed", {"summarize": ["f1", "f2"]}, "summary"),
    ]
    assert [(e.step_id, e.from_status, e.to_status) for e in events_of(settings, run_id)] == [
        (None, None, "queued"),
        ("research", "pending", "running"),
        (None, "queued", "running"),
        # The checkpoint succeeds at its first (inline) attempt: no ``waiting`` hop.
        ("research", "running", "completed"),
        ("summarize", "pending", "running"),
        ("summarize", "running", "completed"),
        (None, "running", "completed"),
    ]
    with session_scope(settings.database_url) as session:
        captured = session.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id)).all()
        assert [(c.step_index, c.state["output"]) for c in captured] == [
            (0, {"facts": ["f1", "f2"]}),
            (1, "summary"),
        ]
        recorded = session.scalars(
            select(Effect).where(Effect.run_id == run_id).order_by(Effect.step_index)
        ).all()
        assert [(e.step_index, e.status, e.attempts) for e in recorded] == [
            (0, EffectStatus.DONE.value, 1),
            (1, EffectStatus.DONE.value, 1),
        ]
    assert len(_turns(settings, run_id)) == 2


def test_each_execution_stamps_the_heartbeat_and_the_deadline(
    settings: Settings, clock: Clock
) -> None:
    run_id = launch(settings, workflow(step_spec(with_={"states": [["running"]]})), now=clock())
    stepper = _stepper(settings, clock)
    outcome = stepper.advance(run_id, 0, 0)
    assert isinstance(outcome, Poll)
    clock.advance(3)
    stepper.advance(run_id, 0, outcome.tick)
    run = run_row(settings, run_id)
    assert run.heartbeat_at == clock()
    step = steps_of(settings, run_id)[0]
    assert step.started_at is not None
    assert run.deadline_at == deadlines.compute(settings, RunStatus.RUNNING, heartbeat_at=clock())


def test_polls_back_off_up_to_the_max_poll_interval(settings: Settings, clock: Clock) -> None:
    run_id = launch(settings, workflow(step_spec(with_={"states": [["running"]]})), now=clock())
    stepper = _stepper(settings, clock)
    countdowns = []
    tick = 0
    for _ in range(7):
        outcome = stepper.advance(run_id, 0, tick)
        assert isinstance(outcome, Poll)
        countdowns.append(outcome.countdown)
        tick = outcome.tick
    assert countdowns == [0.1, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


# -- failures ------------------------------------------------------------------------------


def test_a_failed_turn_fails_the_run_and_skips_the_rest(settings: Settings, clock: Clock) -> None:
    definition = workflow(
        step_spec("a", with_={"states": [["failed"]], "error": "model refused"}),
        step_spec("b"),
    )
    run_id = launch(settings, definition, now=clock())
    assert drive(_stepper(settings, clock), run_id, 0, 0) == [Poll(0.1, 1), Halt("turn failed")]
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("failed", "step_failed")
    assert run.error is not None and "model refused" in run.error
    assert [s.status for s in steps_of(settings, run_id)] == ["failed", "skipped"]


def test_an_output_that_cannot_fill_a_later_task_fails_that_step(
    settings: Settings, clock: Clock
) -> None:
    definition = workflow(
        step_spec("a", with_={"states": [["completed"]], "output": {"other": 1}}),
        step_spec("b", task="{{ steps.a.output.facts }}"),
    )
    run_id = launch(settings, definition, now=clock())
    stepper = _stepper(settings, clock)
    assert drive(stepper, run_id, 0, 0)[-1] == Proceed()
    assert stepper.advance(run_id, 1, 0) == Halt("task could not be rendered")
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("failed", "step_failed")
    assert run.error is not None and "'facts' is not there" in run.error
    assert len(_turns(settings, run_id)) == 1, "no turn starts for an unrenderable task"


def test_an_output_over_the_limit_fails_the_run(
    settings_factory: Callable[..., Settings], clock: Clock
) -> None:
    settings = settings_factory(max_output_bytes=64)
    definition = workflow(step_spec(with_={"states": [["completed"]], "output": "x" * 100}))
    run_id = launch(settings, definition, now=clock())
    assert drive(_stepper(settings, clock), run_id, 0, 0)[-1] == Halt("output too large")
    run = run_row(settings, run_id)
    assert run.status == "failed" and run.error is not None
    assert "ORCH_MAX_OUTPUT_BYTES" in run.error


@pytest.mark.parametrize(
    ("policy", "outcome", "status", "stop_reason"),
    [
        ("fail", Halt("effect exhausted its attempts"), "failed", "effect_failed"),
        ("continue", Proceed(), "completed", "completed"),
    ],
)
def test_an_effect_that_exhausts_its_attempts_follows_the_policy(
    settings_factory: Callable[..., Settings],
    clock: Clock,
    policy: str,
    outcome: Outcome,
    status: str,
    stop_reason: str,
) -> None:
    settings = settings_factory(effect_policy=policy, effect_attempts=2, effect_backoff=0.5)
    definition = workflow(step_spec(with_={"states": [["completed"]], "checkpoint_fails": True}))
    run_id = launch(settings, definition, now=clock())
    stepper = _stepper(settings, clock)
    # The turn is finished at its start; the first (inline) checkpoint attempt fails in
    # that same execution, so the run waits for the retry.
    retry = stepper.advance(run_id, 0, 0)
    assert retry == Poll(0.5, 1)
    assert run_row(settings, run_id).status == RunStatus.WAITING.value
    clock.advance(retry.countdown)
    assert stepper.advance(run_id, 0, retry.tick) == outcome
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == (status, stop_reason)
    with session_scope(settings.database_url) as session:
        effect = session.scalars(select(Effect).where(Effect.run_id == run_id)).one()
        assert (effect.status, effect.attempts) == (EffectStatus.EXHAUSTED.value, 2)
        assert effect.last_error is not None and "checkpoint_fails" in effect.last_error


# -- parks ---------------------------------------------------------------------------------


def test_input_required_parks_for_a_human_and_halts(settings: Settings, clock: Clock) -> None:
    definition = workflow(
        step_spec(with_={"states": [["input_required"]], "prompt": "which one?"}),
    )
    run_id = launch(settings, definition, now=clock())
    stepper = _stepper(settings, clock)
    assert drive(stepper, run_id, 0, 0) == [Poll(0.1, 1), Halt("parked for a human answer")]
    run = run_row(settings, run_id)
    assert (run.status, run.park_reason, run.parked_since) == ("parked", "human", clock())
    assert run.deadline_at == clock() + timedelta(
        seconds=settings.park_budget_human + deadlines.slack_seconds(settings)
    )
    [step] = steps_of(settings, run_id)
    assert (step.status, step.prompt) == ("parked", "which one?")
    # A late redelivery finds the human park and stops again.
    assert stepper.advance(run_id, 0, step.polls) == Halt("parked for a human answer")
    assert run_row(settings, run_id).status == RunStatus.PARKED.value


def test_an_answer_resumes_the_human_park_with_a_new_attempt(
    settings: Settings, clock: Clock
) -> None:
    definition = workflow(step_spec(with_={"states": [["input_required"]]}))
    run_id = launch(settings, definition, now=clock())
    stepper = _stepper(settings, clock)
    drive(stepper, run_id, 0, 0)
    dispatcher = RecordingDispatcher()
    orchestrator = Orchestrator(settings, dispatcher, clock=clock)
    clock.advance(5)
    orchestrator.answer(run_id, "a", {"pick": 2}, owner="owner-1")
    [plan] = dispatcher.chains
    [step] = steps_of(settings, run_id)
    assert (step.attempt, step.status, plan.links[0].tick) == (2, "running", step.polls)
    assert drive(stepper, run_id, 0, plan.links[0].tick)[-1] == Proceed()
    run = run_row(settings, run_id)
    assert (run.status, run.result) == ("completed", {"pick": 2})  # resume_output: the answer
    assert [turn["key"] for turn in _turns(settings, run_id)] == [
        f"{run_id}:a:1",
        f"{run_id}:a:2",
    ]


def test_an_answer_keeps_the_asking_turn_and_the_resumed_start_names_it(
    settings: Settings, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[TurnRequest] = []
    real_start = ScriptedProvider.start

    def start(self: ScriptedProvider, request: TurnRequest) -> str:
        started.append(request)
        return real_start(self, request)

    monkeypatch.setattr(ScriptedProvider, "start", start)
    definition = workflow(step_spec(with_={"states": [["input_required"]]}))
    run_id = launch(settings, definition, now=clock())
    stepper = _stepper(settings, clock)
    drive(stepper, run_id, 0, 0)
    [asking] = steps_of(settings, run_id)
    assert asking.provider_run_id is not None
    orchestrator = Orchestrator(settings, RecordingDispatcher(), clock=clock)
    orchestrator.answer(run_id, "a", "left", owner="owner-1")
    [step] = steps_of(settings, run_id)
    assert (step.provider_run_id, step.asked_turn) == (
        None,
        {"key": f"{run_id}:a:1", "provider_run_id": asking.provider_run_id},
    )
    drive(stepper, run_id, 0, step.polls)
    first, resumed = started
    assert (first.resuming, first.asked) == (False, None)
    assert (resumed.key, resumed.resume, resumed.resuming, resumed.asked) == (
        f"{run_id}:a:2",
        "left",
        True,
        asking.provider_run_id,
    )


def test_rate_limited_parks_engine_limit_until_the_reset(settings: Settings, clock: Clock) -> None:
    definition = workflow(step_spec(with_={"states": [["rate_limited", LONG], ["completed"]]}))
    run_id = launch(settings, definition, now=clock())
    stepper = _stepper(settings, clock)
    started = stepper.advance(run_id, 0, 0)
    assert isinstance(started, Poll)
    parked = stepper.advance(run_id, 0, started.tick)
    assert parked == Poll(1.0, 2)  # waits for the reset, at most max_poll_interval at a time
    run = run_row(settings, run_id)
    [turn] = _turns(settings, run_id)
    assert (run.status, run.park_reason) == ("parked", ParkReason.ENGINE_LIMIT.value)
    assert run.waiting_until == turn["started_at"] + timedelta(seconds=LONG)
    assert run.parked_since == clock()
    assert steps_of(settings, run_id)[0].status == StepStatus.PARKED.value

    _age_turns(settings, LONG + 1)
    assert stepper.advance(run_id, 0, parked.tick) == Proceed()
    run = run_row(settings, run_id)
    assert (run.status, run.park_reason, run.waiting_until) == ("completed", None, None)
    moves = [(e.from_status, e.to_status) for e in events_of(settings, run_id) if not e.step_id]
    assert ("parked", "running") in moves


def test_a_provider_outage_parks_platform_interrupt(
    settings_factory: Callable[..., Settings], clock: Clock
) -> None:
    settings = settings_factory(provider_timeout=0.05)
    # The start's deadline is the engine's clock plus ``provider_timeout`` (0.05 s here),
    # judged on the provider's real clock: an engine clock a second ahead keeps a slow machine
    # from making the start itself late.
    clock.advance(1)
    definition = workflow(step_spec(with_={"states": [["running"]], "poll_delay": 5}))
    run_id = launch(settings, definition, now=clock())
    stepper = _stepper(settings, clock)
    started = stepper.advance(run_id, 0, 0)
    assert isinstance(started, Poll)
    outage = stepper.advance(run_id, 0, started.tick)
    assert isinstance(outage, Poll)
    run = run_row(settings, run_id)
    assert (run.status, run.park_reason) == ("parked", ParkReason.PLATFORM_INTERRUPT.value)
    [step] = steps_of(settings, run_id)
    assert step.status == StepStatus.PARKED.value
    assert step.error is not None and "timed out" in step.error


def test_an_outage_past_the_park_budget_times_the_run_out(
    settings_factory: Callable[..., Settings], clock: Clock
) -> None:
    settings = settings_factory(provider_timeout=0.05, park_budget_platform_interrupt=5)
    # The start's deadline is the engine's clock plus ``provider_timeout`` (0.05 s here),
    # judged on the provider's real clock: an engine clock a second ahead keeps a slow machine
    # from making the start itself late.
    clock.advance(1)
    definition = workflow(step_spec(with_={"states": [["running"]], "poll_delay": 5}))
    run_id = launch(settings, definition, now=clock())
    stepper = _stepper(settings, clock)
    outcomes = [stepper.advance(run_id, 0, 0)]
    outcomes.append(stepper.advance(run_id, 0, 1))
    clock.advance(6)
    outcomes.append(stepper.advance(run_id, 0, 2))
    assert outcomes[-1] == Halt("park expired")
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("timed_out", "park_expired")


def test_a_step_past_its_timeout_is_closed_timed_out(settings: Settings, clock: Clock) -> None:
    definition = workflow(step_spec(timeout=5, with_={"states": [["running"]]}))
    run_id = launch(settings, definition, now=clock())
    stepper = _stepper(settings, clock)
    started = stepper.advance(run_id, 0, 0)
    assert isinstance(started, Poll)
    clock.advance(4)
    polled = stepper.advance(run_id, 0, started.tick)
    assert isinstance(polled, Poll)
    assert polled.countdown <= 1.05, "never sleeps past the step's timeout"
    clock.advance(1.5)
    assert stepper.advance(run_id, 0, polled.tick) == Halt("step timed out")
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("timed_out", "step_timeout")
    assert steps_of(settings, run_id)[0].status == StepStatus.TIMED_OUT.value
    [turn] = _turns(settings, run_id)
    assert turn["cancel_requested_at"] is not None, "the provider turn is cancelled too"
