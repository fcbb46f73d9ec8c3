"""What a tenant controls or a provider returns is bounded, redacted and never a database
error; provider cancels are handed off, bounded and retried, and recorded on the step.

Driven like ``test_stepper``: one ``Stepper.advance`` per call, the scripted provider as the
runtime (and the http provider against a loopback service, or a closed port for an outage).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestration.core.db import utcnow
from orchestration.core.errors import LimitExceeded
from orchestration.core.settings import Settings
from orchestration.core.states import TurnStopStatus
from orchestration.execution import Halt, Poll, Stepper
from orchestration.limits import bounds
from orchestration.runs import turns
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.workflows import templates
from tests.support.hostile_servers import HostileServer, well_behaved
from tests.unit.support import (
    PROPERTY,
    Clock,
    RecordingDispatcher,
    drive,
    force_step,
    launch,
    make_settings,
    run_row,
    step_spec,
    steps_of,
    workflow,
)

SECRET = "s3cr3t-token-value-4242"


@pytest.fixture
def clock() -> Clock:
    return Clock(utcnow())


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_template_that_would_expand_to_gigabytes_stops_at_its_bound() -> None:
    started = time.perf_counter()
    with pytest.raises(LimitExceeded) as raised:
        templates.render("{{ args.a }}" * 6000, {"args": {"a": "x" * 60000}}, "task", limit=262144)
    assert "ORCH_MAX_RENDERED_TASK_BYTES" in str(raised.value)
    # 360 MB would take seconds and gigabytes to build; the bound stops it near 256 KB.
    assert time.perf_counter() - started < 1.0


def test_a_template_within_its_bound_renders_as_before() -> None:
    rendered = templates.render(
        {"q": "{{ args.a }} and {{ args.a }}", "n": "{{ args.n }}"},
        {"args": {"a": "x", "n": [1, 2]}},
        limit=100,
    )
    assert rendered == {"q": "x and x", "n": [1, 2]}


def test_a_task_rendering_over_its_bound_fails_over_limit_and_starts_no_turn(
    settings_factory: Callable[..., Settings], clock: Clock
) -> None:
    settings = settings_factory(max_rendered_task_bytes=1000)
    definition = workflow(step_spec(task="{{ args.a }} " * 20))
    run_id = launch(settings, definition, {"a": "y" * 100}, now=clock())
    assert Stepper(settings, Executor(settings, None), clock=clock).advance(run_id, 0, 0) == Halt(
        "task renders over its bound"
    )
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("failed", "over_limit")
    assert run.error is not None and "ORCH_MAX_RENDERED_TASK_BYTES" in run.error
    assert steps_of(settings, run_id)[0].provider_run_id is None


def test_a_provider_run_id_over_its_bound_fails_over_limit_not_as_a_database_error(
    settings_factory: Callable[..., Settings], clock: Clock
) -> None:
    settings = settings_factory(max_provider_id_chars=8)  # scripted ids are 29 characters
    run_id = launch(settings, workflow(), now=clock())
    outcomes = drive(Stepper(settings, Executor(settings, None), clock=clock), run_id)
    assert outcomes[-1] == Halt("provider run id over its bound")
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("failed", "over_limit")
    assert run.error is not None and "ORCH_MAX_PROVIDER_ID_CHARS" in run.error


@pytest.mark.parametrize(
    ("options", "halt", "setting"),
    [
        ({"states": [["completed"]], "output": "x" * 500}, "output too large", "OUTPUT"),
        ({"states": [["input_required"]], "prompt": "?" * 500}, "prompt too large", "PROMPT"),
    ],
)
def test_outputs_and_prompts_over_their_bound_fail_over_limit(
    settings_factory: Callable[..., Settings],
    clock: Clock,
    options: dict[str, Any],
    halt: str,
    setting: str,
) -> None:
    settings = settings_factory(max_output_bytes=200, max_prompt_bytes=200)
    run_id = launch(settings, workflow(step_spec(with_=options)), now=clock())
    assert drive(Stepper(settings, Executor(settings, None), clock=clock), run_id)[-1] == Halt(halt)
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("failed", "over_limit")
    assert run.error is not None and f"ORCH_MAX_{setting}_BYTES" in run.error


def test_a_long_provider_error_is_cut_to_its_bound_saying_so(
    settings_factory: Callable[..., Settings], clock: Clock
) -> None:
    settings = settings_factory(max_error_chars=300, max_options_bytes=200_000)
    options = {"states": [["failed"]], "error": "E" * 100_000}
    run_id = launch(settings, workflow(step_spec(with_=options)), now=clock())
    assert drive(Stepper(settings, Executor(settings, None), clock=clock), run_id)[-1] == Halt(
        "turn failed"
    )
    run = run_row(settings, run_id)
    step = steps_of(settings, run_id)[0]
    assert run.error is not None and len(run.error) <= 300
    assert "ORCH_MAX_ERROR_CHARS" in run.error
    assert step.error is not None and len(step.error) <= 300


def test_what_a_provider_returns_is_redacted_and_stripped_of_nul_before_it_is_stored(
    settings_factory: Callable[..., Settings],
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENT_TOKEN", SECRET)
    settings = settings_factory(provider_secrets={"AGENT_TOKEN": ["127.0.0.1"]})
    # A service answers the NUL: a workflow may not hold one (PostgreSQL cannot store it).
    answer = {"id": "turn-1", "state": "completed"}
    answer["result"] = {"echo": f"Bearer {SECRET}", "nul": "a\x00b"}
    failing = {"states": [["failed"]], "error": f"auth header was Bearer {SECRET}"}
    with HostileServer(well_behaved(answer)) as service:
        echoed = {
            "start": {"url": f"{service.url}/runs"},
            "status": {"url": f"{service.url}/runs/{{run_id}}"},
            "cancel": {"url": f"{service.url}/runs/{{run_id}}/cancel"},
            "run_id_path": "id",
            "status_path": "state",
            "output_path": "result",
        }
        done = launch(settings, workflow(step_spec(provider="http", with_=echoed)), now=clock())
        failed = launch(settings, workflow(step_spec(with_=failing)), now=clock())
        stepper = Stepper(settings, Executor(settings, None), clock=clock)
        drive(stepper, done)
        drive(stepper, failed)
    output = steps_of(settings, done)[0].output
    assert output == {"echo": "Bearer ***", "nul": "ab"}
    failed_run = run_row(settings, failed)
    assert failed_run.error is not None and SECRET not in failed_run.error
    assert "***" in failed_run.error


def test_a_timed_out_step_hands_its_turn_stop_to_the_stop_task(
    settings_factory: Callable[..., Settings], clock: Clock
) -> None:
    settings = settings_factory()
    dispatcher = RecordingDispatcher()
    definition = workflow(step_spec(timeout=1, with_={"states": [["running", 600]]}))
    run_id = launch(settings, definition, now=clock())
    transact = Executor(settings, dispatcher)
    stepper = Stepper(settings, transact, clock=clock)
    outcome = stepper.advance(run_id, 0, 0)
    assert isinstance(outcome, Poll)
    clock.advance(2)
    assert stepper.advance(run_id, 0, outcome.tick) == Halt("step timed out")
    # The provider was not called inside the step's transaction: the stop is pending, sent.
    assert dispatcher.stops == [(run_id, 0)]
    assert steps_of(settings, run_id)[0].turn_stop["status"] == "pending"
    assert turns.attempt(transact, settings, run_id, 0, clock()) is None
    stop = steps_of(settings, run_id)[0].turn_stop
    assert (stop["status"], stop["attempts"], stop["error"]) == ("stopped", 1, None)
    assert turns.attempt(transact, settings, run_id, 0, clock()) is None, (
        "a settled stop is not redone"
    )


def test_cancel_stops_a_well_behaved_turn_inline_and_records_it(
    settings_factory: Callable[..., Settings], clock: Clock
) -> None:
    settings = settings_factory()
    dispatcher = RecordingDispatcher()
    run_id = launch(settings, workflow(step_spec(with_={"states": [["running", 600]]})))
    assert isinstance(
        Stepper(settings, Executor(settings, dispatcher), clock=clock).advance(run_id, 0, 0), Poll
    )
    record = Orchestrator(settings, dispatcher, clock=clock).cancel(run_id, owner="owner-1")
    assert record.status == "cancelled"
    assert dispatcher.stops == []
    assert steps_of(settings, run_id)[0].turn_stop["status"] == TurnStopStatus.STOPPED.value


def _http_step(port: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    return step_spec(
        provider="http",
        with_={
            "start": {"url": f"{base}/runs"},
            "status": {"url": f"{base}/runs/{{run_id}}"},
            "cancel": {"url": f"{base}/runs/{{run_id}}/cancel"},
            "run_id_path": "id",
            "status_path": "status",
        },
    )


def test_a_cancel_that_cannot_reach_its_provider_is_retried_then_recorded_failed(
    settings_factory: Callable[..., Settings], clock: Clock
) -> None:
    settings = settings_factory(stop_attempts=3, cancel_call_timeout=0.5)
    dispatcher = RecordingDispatcher()
    run_id = launch(settings, workflow(_http_step(_closed_port())), now=clock())
    force_step(
        settings,
        run_id,
        0,
        status="running",
        idempotency_key=f"{run_id}:a:1",
        provider_run_id="remote-1",
    )
    started = time.perf_counter()
    orchestrator = Orchestrator(settings, dispatcher, clock=clock)
    record = orchestrator.cancel(run_id, owner="owner-1")
    assert record.status == "cancelled"
    assert time.perf_counter() - started < 0.5 + 2.0
    assert dispatcher.stops == [(run_id, 0)]
    stop = steps_of(settings, run_id)[0].turn_stop
    assert (stop["status"], stop["attempts"]) == ("pending", 1)
    assert "cannot reach" in stop["error"]
    assert turns.attempt(orchestrator.transact, settings, run_id, 0, clock()) == 2.0
    assert (
        turns.attempt(orchestrator.transact, settings, run_id, 0, clock() + timedelta(seconds=2))
        is None
    )
    stop = steps_of(settings, run_id)[0].turn_stop
    assert (stop["status"], stop["attempts"]) == ("failed", 3)
    assert stop["error"].startswith("gave up after 3 attempts")


_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=30,
)


@PROPERTY
@given(
    values=st.dictionaries(st.sampled_from(["a", "b", "c"]), _JSON, min_size=3),
    pieces=st.lists(
        st.sampled_from(["{{ args.a }}", "{{ args.b }}", "{{args.c}}", "text ", '\u00e9\\"']),
        max_size=30,
    ),
    shape=st.sampled_from(["string", "list", "dict"]),
    limit=st.integers(2, 4000),
)
def test_a_rendered_task_is_never_over_its_bound(
    values: dict[str, Any], pieces: list[str], shape: str, limit: int
) -> None:
    text = "".join(pieces)
    task: Any = {"string": text, "list": [text, pieces], "dict": {"q": text, "p": pieces}}[shape]
    try:
        rendered = templates.render(task, {"args": values}, limit=limit)
    except LimitExceeded:
        return
    assert bounds.json_bytes(rendered) <= limit


@PROPERTY
@given(answer=_JSON, error=st.text(max_size=3000))
def test_what_a_provider_answers_is_stored_redacted_and_bounded(
    answer: Any, error: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    settings = make_settings(
        tmp_path_factory.mktemp("p"),
        max_error_chars=500,
        provider_secrets={"AGENT_TOKEN": ["127.0.0.1"]},
    )
    salted = [answer, f"x{SECRET}y", {"k": SECRET}]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENT_TOKEN", SECRET)
        cut = bounds.error_text(error + SECRET + "\x00", settings)
        kept = bounds.json_value(salted, settings)
    assert len(cut) <= 500 and "\x00" not in cut and SECRET not in cut
    stored = json.dumps(kept, ensure_ascii=False)
    assert SECRET not in stored and "\\u0000" not in stored
