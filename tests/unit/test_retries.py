"""Step retries (issue 12): ``retry: {attempts, backoff, max_backoff, on}``.

Each attempt is a turn of its own key; the wait between attempts is a countdown (each
execution before ``retry_at`` only stamps the heartbeat); a turn that may still run is
stopped before the next attempt starts; the attempts and their errors are on the step; what
``on`` does not list, a cancel, and the last attempt are never retried.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestration.core import health
from orchestration.core.db import session_scope
from orchestration.core.errors import LimitExceeded, ValidationError
from orchestration.core.settings import Settings
from orchestration.execution import Halt, Poll, Proceed, Stepper
from orchestration.providers.scripted import ScriptedProvider
from orchestration.reads.explain import explain
from orchestration.runs import turns
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.workflows import load_file, parse
from tests.unit.support import (
    T0,
    Clock,
    RecordingDispatcher,
    events_of,
    launch,
    run_row,
    step_spec,
    steps_of,
    workflow,
)

FAILS_TWICE = {"attempt_states": [[["failed"]], [["failed"]]], "states": [["completed"]]}


def _stepper(settings: Settings, clock: Clock, queue: Any = None) -> Stepper:
    return Stepper(settings, Executor(settings, queue), clock=clock, worker="unit", pid=1)


def _retrying(**retry: Any) -> dict[str, Any]:
    return {"attempts": 3, "backoff": 2, "max_backoff": 60, **retry}


def _first_attempt_ended(
    settings: Settings,
    clock: Clock,
    options: dict[str, Any],
    retry: dict[str, Any],
    queue: Any = None,
) -> tuple[str, Stepper, int]:
    """Launch one retried step and run it until its first attempt has ended."""
    run_id = launch(settings, workflow(step_spec(with_=options, retry=retry)))
    stepper = _stepper(settings, clock, queue)
    _, tick = _until_not_polling(stepper, run_id, 0)
    return run_id, stepper, tick


def _until_not_polling(stepper: Stepper, run_id: str, tick: int) -> tuple[Any, int]:
    """Executions until one is not a plain poll of a running turn (the step task's body)."""
    for _ in range(10):
        outcome = stepper.advance(run_id, 0, tick)
        if not isinstance(outcome, Poll) or steps_of(stepper.settings, run_id)[0].status in (
            "retrying",
            "completed",
        ):
            return outcome, getattr(outcome, "tick", tick)
        tick = outcome.tick
    pytest.fail("the step kept polling")


def test_a_failed_attempt_is_retried_after_its_backoff_and_the_third_succeeds(
    settings: Settings,
) -> None:
    clock = Clock(T0)
    run_id = launch(settings, workflow(step_spec(with_=FAILS_TWICE, retry=_retrying())))
    stepper = _stepper(settings, clock)

    outcome, tick = _until_not_polling(stepper, run_id, 0)
    step = steps_of(settings, run_id)[0]
    assert (step.status, step.attempt, outcome) == ("retrying", 2, Poll(2.0, tick))
    assert step.retry_at == clock.now + timedelta(seconds=2)
    record = Orchestrator(settings, None).get(run_id, owner="owner-1")
    with session_scope(settings.database_url) as session:
        judged = health.judge(session, settings, run_id, clock.now)
    assert judged is not None
    said = explain(settings, record, judged, clock.now)
    assert "ended attempt 1 of 3 (failed: scripted failure)" in said["why"]
    # The latest end counts the attempts left: this one's timeout, then attempt 3's wait
    # (4 s) and its timeout.
    latest = step.retry_at + timedelta(seconds=1800 + 4 + 1800)
    assert said["next"] == (
        f"attempt 2 starts at {step.retry_at.isoformat(timespec='seconds')}; with every "
        f"attempt left the step ends by {latest.isoformat(timespec='seconds')}"
    )
    # Before ``retry_at`` an execution only waits out the rest of the backoff.
    clock.advance(0.5)
    assert stepper.advance(run_id, 0, tick) == Poll(1.5, tick + 1)
    clock.advance(1.5)
    outcome, tick = _until_not_polling(stepper, run_id, tick + 1)
    step = steps_of(settings, run_id)[0]
    assert (step.status, step.attempt) == ("retrying", 3)
    assert step.retry_at == clock.now + timedelta(seconds=4), "the backoff doubles"
    # A wait longer than a poll may be goes in hops of ORCH_MAX_POLL_INTERVAL_LIMIT.
    assert outcome == Poll(min(4.0, settings.max_poll_interval_limit), tick)
    clock.advance(4)
    assert _until_not_polling(stepper, run_id, tick)[0] == Proceed()

    run, step = run_row(settings, run_id), steps_of(settings, run_id)[0]
    assert (run.status, step.status, step.attempt, step.error) == (
        "completed",
        "completed",
        3,
        None,
    )
    assert [(a["attempt"], a["reason"], a["error"]) for a in step.past_attempts] == [
        (1, "failed", "scripted failure"),
        (2, "failed", "scripted failure"),
    ]
    started = ScriptedProvider(settings).start_calls(f"{run_id}:")
    assert [call["key"] for call in started] == [f"{run_id}:a:{n}" for n in (1, 2, 3)]
    assert {call["outcome"] for call in started} == {"started"}, "one turn per attempt"
    moves = [(e.from_status, e.to_status) for e in events_of(settings, run_id) if e.step_id]
    assert moves.count(("running", "retrying")) == 2
    assert moves.count(("retrying", "running")) == 2


def test_the_last_attempt_failing_fails_the_run_and_says_which_attempt(
    settings: Settings,
) -> None:
    clock = Clock(T0)
    options = {"attempt_states": [[["failed"]], [["failed"]]]}
    run_id, stepper, tick = _first_attempt_ended(settings, clock, options, _retrying(attempts=2))
    clock.advance(2)
    outcome, _ = _until_not_polling(stepper, run_id, tick)
    assert isinstance(outcome, Halt)
    run, step = run_row(settings, run_id), steps_of(settings, run_id)[0]
    assert (run.status, run.stop_reason, step.status) == ("failed", "step_failed", "failed")
    assert run.error == "step a: scripted failure (attempt 2 of 2)"
    assert len(step.past_attempts) == 1


def test_a_failure_the_retry_does_not_list_is_not_retried(settings: Settings) -> None:
    options = {"attempt_states": [[["failed"]]]}
    run_id = launch(
        settings, workflow(step_spec(with_=options, retry=_retrying(on=["rate_limited"])))
    )
    outcome, _ = _until_not_polling(_stepper(settings, Clock(T0)), run_id, 0)
    assert isinstance(outcome, Halt)
    assert run_row(settings, run_id).status == "failed"
    assert steps_of(settings, run_id)[0].past_attempts is None


def test_a_cancel_during_the_backoff_ends_the_run_and_no_attempt_starts(
    settings: Settings,
) -> None:
    clock = Clock(T0)
    run_id, stepper, tick = _first_attempt_ended(settings, clock, FAILS_TWICE, _retrying())
    record = Orchestrator(settings, RecordingDispatcher(), clock=clock).cancel(
        run_id, owner="owner-1"
    )
    assert (record.status, record.steps[0].status) == ("cancelled", "cancelled")
    clock.advance(5)
    assert isinstance(stepper.advance(run_id, 0, tick), Halt)
    keys = [call["key"] for call in ScriptedProvider(settings).start_calls(f"{run_id}:")]
    assert keys == [f"{run_id}:a:1"], "no turn for attempt 2"


def test_a_rate_limited_attempt_is_stopped_before_the_next_one_starts(
    settings: Settings,
) -> None:
    clock = Clock(T0)
    queue = RecordingDispatcher()
    options = {"attempt_states": [[["rate_limited", 1000]]], "states": [["completed"]]}
    retry = _retrying(attempts=2, backoff=1, on=["rate_limited"])
    run_id, stepper, tick = _first_attempt_ended(settings, clock, options, retry, queue)
    step = steps_of(settings, run_id)[0]
    assert (step.status, step.attempt) == ("retrying", 2)
    assert step.turn_stop["key"] == f"{run_id}:a:1" and step.turn_stop["status"] == "pending"
    assert queue.stops == [(run_id, 0)], "the old turn's stop goes to the stop task"
    assert run_row(settings, run_id).status == "running", "a retry is not a park"

    clock.advance(1)
    # The backoff is over, but attempt 1's turn is not stopped yet: attempt 2 waits.
    held = stepper.advance(run_id, 0, tick)
    assert isinstance(held, Poll) and steps_of(settings, run_id)[0].status == "retrying"
    assert turns.attempt(Executor(settings, None), settings, run_id, 0, clock.now) is None
    stop = steps_of(settings, run_id)[0].turn_stop
    assert (stop["status"], stop["key"]) == ("stopped", f"{run_id}:a:1")
    old = next(t for t in ScriptedProvider(settings).turns(run_id) if t["key"].endswith(":1"))
    assert old["cancel_requested_at"] is not None, "the provider saw the cancel"
    assert _until_not_polling(stepper, run_id, held.tick)[0] == Proceed()
    step = steps_of(settings, run_id)[0]
    assert (step.status, step.attempt, step.provider_run_id) == (
        "completed",
        2,
        next(t for t in ScriptedProvider(settings).turns(run_id) if t["key"].endswith(":2"))[
            "provider_run_id"
        ],
    )
    assert step.past_attempts[0]["reason"] == "rate_limited"


@pytest.mark.parametrize(
    ("retry", "field", "error"),
    [
        ({"attempts": 11}, "steps[0].retry.attempts", LimitExceeded),
        ({"attempts": 2, "max_backoff": 7200}, "steps[0].retry.max_backoff", LimitExceeded),
        ({"attempts": 2, "backoff": 5, "max_backoff": 1}, "steps[0].retry.max_backoff", None),
        ({"attempts": 2, "on": ["timeout"]}, "steps[0].retry.on[0]", None),
        ({"attempts": 0}, "steps[0].retry.attempts", None),
        ({"attempts": 2, "tries": 3}, "steps[0].retry.tries", None),
    ],
)
def test_a_retry_out_of_bounds_is_refused_naming_its_field(
    settings: Settings, retry: dict[str, Any], field: str, error: type[Exception] | None
) -> None:
    with pytest.raises(error or ValidationError) as caught:
        parse(workflow(step_spec(retry=retry)), settings)
    assert caught.value.field == field  # type: ignore[attr-defined]


def test_a_step_without_retry_is_stored_as_before(settings: Settings) -> None:
    run_id = launch(settings, workflow(step_spec()))
    assert "retry" not in run_row(settings, run_id).workflow["steps"][0]


def test_an_unreachable_provider_is_retried_and_then_parks_as_without_retry(
    settings_factory: Callable[..., Settings],
) -> None:
    """``platform_interrupt``: an attempt whose provider cannot be reached ends and the next
    starts after the backoff; once no attempt is left, the step parks as it always has."""
    settings = settings_factory(provider_timeout=0.2)
    clock = Clock(T0)
    retry = _retrying(attempts=2, backoff=1, on=["platform_interrupt"])
    run_id = launch(settings, workflow(step_spec(with_={"poll_delay": 0.3}, retry=retry)))
    stepper = _stepper(settings, clock)
    first, tick = _until_not_polling(stepper, run_id, 0)
    step = steps_of(settings, run_id)[0]
    assert isinstance(first, Poll) and (step.status, step.attempt) == ("retrying", 2)
    assert step.past_attempts[0]["reason"] == "platform_interrupt"
    assert "timed out" in step.past_attempts[0]["error"]
    assert step.turn_stop["status"] == "stopped", "no queue: the stop was tried after commit"
    clock.advance(1)
    for _ in range(3):  # the start, then the poll that finds the provider unreachable
        outcome = stepper.advance(run_id, 0, tick)
        assert isinstance(outcome, Poll)
        tick = outcome.tick
    run, step = run_row(settings, run_id), steps_of(settings, run_id)[0]
    assert (run.status, run.park_reason, step.attempt) == ("parked", "platform_interrupt", 2)


def test_a_bare_yaml_on_key_is_the_retry_on_list(settings: Settings, tmp_path: Path) -> None:
    """YAML 1.1 reads ``on:`` as the boolean true; the retry block takes it as ``on``."""
    path = tmp_path / "wf.yaml"
    path.write_text(
        "name: w\nsteps:\n  - id: a\n    provider: scripted\n"
        "    retry: {attempts: 2, on: [rate_limited, failed]}\n",
        encoding="utf-8",
    )
    spec = parse(load_file(path), settings)
    assert spec.steps[0].retry is not None
    assert spec.steps[0].retry.on == ("rate_limited", "failed")


def test_a_lost_stop_of_the_previous_turn_is_sent_again_so_the_wait_stays_bounded(
    settings: Settings,
) -> None:
    """The stop task message of attempt 1's turn never arrives (the queue only records it):
    once no attempt of that stop came for longer than one takes, the step hands it out again
    instead of waiting on it forever."""
    clock = Clock(T0)
    queue = RecordingDispatcher()
    options = {"attempt_states": [[["rate_limited", 1000]]], "states": [["completed"]]}
    retry = _retrying(attempts=2, backoff=1, on=["rate_limited"])
    run_id, stepper, tick = _first_attempt_ended(settings, clock, options, retry, queue)
    assert queue.stops == [(run_id, 0)]
    stopped_at = steps_of(settings, run_id)[0].turn_stop["at"]
    clock.advance(5)
    tick = stepper.advance(run_id, 0, tick).tick
    assert queue.stops == [(run_id, 0)], "a stop in its window is waited for"
    clock.advance(settings.provider_timeout + 30)
    tick = stepper.advance(run_id, 0, tick).tick
    assert queue.stops == [(run_id, 0)] * 2, "the silent stop is handed out again"
    assert steps_of(settings, run_id)[0].turn_stop["at"] > stopped_at
    assert turns.attempt(Executor(settings, None), settings, run_id, 0, clock.now) is None
    assert _until_not_polling(stepper, run_id, tick)[0] == Proceed()
