"""The provider start is claimed, called with no lock held, then recorded; ``cancel`` waits
for a claim in flight (bounded by one provider call), so no turn starts after it returns.

A real http provider against a loopback service whose start answers slowly; the step
execution runs in a thread while the test cancels or closes the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from orchestration.core.db import utcnow
from orchestration.core.followups import Done
from orchestration.core.settings import Settings
from orchestration.core.states import RunStatus, StopReason
from orchestration.execution import Outcome, Poll, Stepper
from orchestration.runs.closing import end_run
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from tests.support.hostile_servers import Conversation, HostileServer, well_behaved
from tests.unit.support import RecordingDispatcher, force_step, launch, run_row, steps_of, workflow

START_SECONDS = 1.0


class SlowStartService:
    """Answers ``POST /runs`` after ``START_SECONDS`` with turn ``turn-9``; records when each
    start and cancel arrived and when each start answered."""

    def __init__(self) -> None:
        self.started: list[tuple[float, float]] = []
        self.cancelled: list[tuple[float, str]] = []
        #: Set by a test that must act while the start is in flight: the start then answers
        #: once it is set (within the call's bound), not after a fixed time.
        self.gate: threading.Event | None = None
        #: Set when a start arrives, before it is answered.
        self.start_arrived = threading.Event()

    def __call__(self, talk: Conversation) -> None:
        arrived = time.monotonic()
        if talk.request.target.endswith("/cancel"):
            self.cancelled.append((arrived, talk.request.target))
            well_behaved({})(talk)
            return
        if talk.request.method == "POST":
            self.start_arrived.set()
            if self.gate is None:
                talk.pause(START_SECONDS)
            else:
                self.gate.wait(START_SECONDS * 2.5)
            well_behaved({"id": "turn-9"})(talk)
            self.started.append((arrived, time.monotonic()))
            return
        well_behaved({"id": "turn-9", "state": "running"})(talk)


@pytest.fixture
def service() -> Iterator[tuple[SlowStartService, HostileServer]]:
    behaviour = SlowStartService()
    with HostileServer(behaviour) as server:
        yield behaviour, server


def _workflow(url: str) -> dict[str, Any]:
    return workflow(
        {
            "id": "a",
            "provider": "http",
            "task": "t",
            "poll_interval": 0.1,
            "max_poll_interval": 1.0,
            "with": {
                "start": {"url": f"{url}/runs"},
                "status": {"url": f"{url}/runs/{{run_id}}"},
                "cancel": {"url": f"{url}/runs/{{run_id}}/cancel"},
                "run_id_path": "id",
                "status_path": "state",
            },
        }
    )


def _in_thread(work: Callable[[], Outcome]) -> tuple[threading.Thread, list[Outcome]]:
    outcomes: list[Outcome] = []
    thread = threading.Thread(target=lambda: outcomes.append(work()), daemon=True)
    thread.start()
    return thread, outcomes


def _wait_for_start_in_flight(settings: Settings, run_id: str, behaviour: SlowStartService) -> None:
    """Until the claimed start has reached the service. The claim commits before the call is
    sent: a cancel or close in between is honoured before any call, and no turn starts."""
    assert behaviour.start_arrived.wait(5), "the start never reached the service"
    assert steps_of(settings, run_id)[0].start_claimed_at is not None


def test_cancel_waits_for_a_start_in_flight_and_stops_the_turn_it_recorded(
    settings: Settings, service: tuple[SlowStartService, HostileServer]
) -> None:
    behaviour, server = service
    run_id = launch(settings, _workflow(server.url), now=utcnow())
    stepper = Stepper(settings, Executor(settings, None))
    thread, _ = _in_thread(lambda: stepper.advance(run_id, 0, 0))
    _wait_for_start_in_flight(settings, run_id, behaviour)
    record = Orchestrator(settings, RecordingDispatcher()).cancel(run_id, owner="owner-1")
    returned = time.monotonic()
    thread.join(10)
    assert record.status == "cancelled"
    [(_, answered)] = behaviour.started
    assert answered <= returned, "cancel returned while the start was still in flight"
    # The canceller and the refused execution may both stop it: a cancel is idempotent.
    assert {target for _, target in behaviour.cancelled} == {"/runs/turn-9/cancel"}
    step = steps_of(settings, run_id)[0]
    assert (step.provider_run_id, step.turn_stop["status"]) == ("turn-9", "stopped")
    assert step.start_claimed_at is None


def test_a_claim_left_by_a_dead_worker_holds_cancel_for_at_most_one_call(
    settings: Settings, service: tuple[SlowStartService, HostileServer]
) -> None:
    _, server = service
    run_id = launch(settings, _workflow(server.url), now=utcnow())
    stale = utcnow() - timedelta(seconds=settings.provider_timeout + 5)
    force_step(settings, run_id, 0, status="running", idempotency_key=f"{run_id}:a:1")
    force_step(settings, run_id, 0, start_claimed_at=stale)
    started = time.monotonic()
    record = Orchestrator(settings, RecordingDispatcher()).cancel(run_id, owner="owner-1")
    assert record.status == "cancelled"
    # Waiting for the claim would take its window (one call's bound and the margin); a cancel
    # that does not wait takes a fraction of one call, however loaded the machine.
    waited = time.monotonic() - started
    assert waited < settings.provider_timeout / 2, f"a stale claim is not waited for: {waited}"


def test_a_start_that_outlives_its_run_stops_its_own_turn(
    settings: Settings, service: tuple[SlowStartService, HostileServer]
) -> None:
    behaviour, server = service
    behaviour.gate = threading.Event()
    run_id = launch(settings, _workflow(server.url), now=utcnow())
    stepper = Stepper(settings, Executor(settings, RecordingDispatcher()))
    thread, outcomes = _in_thread(lambda: stepper.advance(run_id, 0, 0))
    _wait_for_start_in_flight(settings, run_id, behaviour)
    # The sweeper closes the run meanwhile (here: directly, as its close does).
    sweeper_queue = RecordingDispatcher()
    Executor(settings, sweeper_queue)(
        lambda session: Done(
            None,
            end_run(
                session,
                settings,
                run_id,
                RunStatus.TIMED_OUT,
                stop_reason=StopReason.DEADLINE_EXCEEDED,
                cause="test",
                now=utcnow(),
            ),
        )
    )
    # The close records a pending stop for the claimed turn and hands it to the stop task
    # (not run here): the turn's id is unknown to it while the start is in flight.
    assert sweeper_queue.stops == [(run_id, 0)]
    behaviour.gate.set()  # the start answers only now, however slow the close was
    thread.join(10)
    assert run_row(settings, run_id).status == "timed_out"
    assert len(outcomes) == 1
    assert [target for _, target in behaviour.cancelled] == ["/runs/turn-9/cancel"]
    step = steps_of(settings, run_id)[0]
    assert (step.provider_run_id, step.turn_stop["status"]) == ("turn-9", "stopped")


def test_two_deliveries_executed_at_once_start_one_turn(settings: Settings) -> None:
    """A step's message delivered twice (a redelivery) and executed at the same moment, each
    execution on connections of its own: one claims the start and calls the provider, the
    other finds the claim (or the turn it recorded) and calls nothing."""
    from orchestration.providers.scripted import ScriptedProvider
    from tests.unit.support import step_spec

    run_id = launch(settings, workflow(step_spec(with_={"states": [["running", 1000]]})))
    together = threading.Barrier(2)

    def deliver() -> Outcome:
        stepper = Stepper(settings, Executor(settings, None))
        together.wait(10)
        return stepper.advance(run_id, 0, 0)

    deliveries = [_in_thread(deliver) for _ in range(2)]
    for thread, _ in deliveries:
        thread.join(20)
    assert [len(outcomes) for _, outcomes in deliveries] == [1, 1], "a delivery raised"
    kinds = sorted(type(outcome).__name__ for _, outcomes in deliveries for outcome in outcomes)
    assert kinds == ["Halt", "Poll"]
    assert len(ScriptedProvider(settings).start_calls(run_id + ":")) == 1
    step = steps_of(settings, run_id)[0]
    assert (step.status, step.start_claimed_at) == ("running", None)
    assert step.provider_run_id is not None


def test_a_duplicate_delivery_never_starts_a_turn_while_a_start_is_in_flight(
    settings: Settings,
) -> None:
    """Chaos finding: a redelivered message fenced the step while the first delivery was in
    its start call (then its status call), found no turn recorded, and called ``start`` on
    the same key again. A live claim makes it wait; a claim older than one call's deadline
    and the margin belongs to a dead execution, and the start is tried again."""
    from orchestration.providers.scripted import ScriptedProvider
    from orchestration.runs import turns
    from tests.unit.support import T0, Clock, step_spec

    run_id = launch(settings, workflow(step_spec(with_={"states": [["running", 1000]]})))
    force_step(settings, run_id, 0, status="running", started_at=T0, start_claimed_at=T0, polls=1)
    clock = Clock(T0 + timedelta(seconds=1))
    stepper = Stepper(settings, Executor(settings, None), clock=clock)
    waited = stepper.advance(run_id, 0, 1)
    assert waited == Poll(0.1, 2)
    assert ScriptedProvider(settings).start_calls(run_id + ":") == []
    clock.advance(turns.claim_window(settings).total_seconds())
    assert isinstance(stepper.advance(run_id, 0, 2), Poll)
    assert len(ScriptedProvider(settings).start_calls(run_id + ":")) == 1
    assert steps_of(settings, run_id)[0].provider_run_id is not None


def test_a_claim_whose_commit_came_back_late_starts_no_turn_until_claimed_again(
    settings: Settings,
) -> None:
    """Chaos finding (a partition): the claim's commit came back 9 s late, and the start that
    followed outlived the window other executions gave the claim. A commit later than the
    margin now starts nothing; the run parks as interrupted and the next execution claims
    again and starts."""
    from orchestration.core.settings import MARGIN_SECONDS
    from orchestration.providers.scripted import ScriptedProvider
    from tests.unit.support import T0, Clock, step_spec

    run_id = launch(settings, workflow(step_spec(with_={"states": [["running", 1000]]})))
    late = iter([T0, T0 + timedelta(seconds=MARGIN_SECONDS + 0.5)])
    stepper = Stepper(
        settings, Executor(settings, None), clock=lambda: next(late, T0 + timedelta(seconds=3))
    )
    outcome = stepper.advance(run_id, 0, 0)
    assert isinstance(outcome, Poll)
    assert ScriptedProvider(settings).start_calls(run_id + ":") == []
    run, step = run_row(settings, run_id), steps_of(settings, run_id)[0]
    assert (run.status, run.park_reason) == ("parked", "platform_interrupt")
    assert "took 2.5s to commit" in (step.error or "") and step.start_claimed_at is None
    clock = Clock(T0 + timedelta(seconds=5))
    again = Stepper(settings, Executor(settings, None), clock=clock).advance(
        run_id, 0, outcome.tick
    )
    assert isinstance(again, Poll)
    assert len(ScriptedProvider(settings).start_calls(run_id + ":")) == 1


def test_a_stale_start_never_clears_a_newer_claim_of_the_same_turn(settings: Settings) -> None:
    """Chaos finding (a partition): a start whose record found the run moved on cleared the
    step's claim with no check, though a re-armed execution had claimed it since."""
    from orchestration.execution import releasing
    from orchestration.execution.starting import StartCall
    from orchestration.providers.base import TurnRequest
    from tests.unit.support import T0, step_spec

    run_id = launch(settings, workflow(step_spec()))
    key = f"{run_id}:a:1"
    newer = T0 + timedelta(seconds=9)
    force_step(settings, run_id, 0, status="running", idempotency_key=key, start_claimed_at=newer)
    request = TurnRequest(key=key, run_id=run_id, step_id="a", attempt=1, input="t", options={})
    stale = StartCall(request, "scripted", T0)
    releasing.release_refused_start(
        settings, Executor(settings, None), T0 + timedelta(seconds=10), run_id, 0, stale, "turn-1"
    )
    step = steps_of(settings, run_id)[0]
    assert (step.start_claimed_at, step.provider_run_id) == (newer, None)


def test_a_stale_start_leaves_alone_a_step_that_recorded_its_turn_since(
    settings: Settings,
) -> None:
    """Chaos finding (a partition, CI of 2026-12-02): the start's answer came back after the
    cut healed; meanwhile a re-armed execution had started the same key, found that turn
    finished and completed the run. The stale execution found the run moved and stopped the
    turn and wrote the step (a write after the takeover). The step holds that very turn, so
    the stale execution writes and stops nothing."""
    from orchestration.execution import releasing
    from orchestration.execution.starting import StartCall
    from orchestration.providers.scripted import ScriptedProvider
    from tests.unit.support import T0

    run_id, request, turn = _scripted_turn(settings, attempt=1)
    key, provider = request.key, ScriptedProvider(settings)
    done_at = T0 + timedelta(seconds=9)
    force_step(
        settings,
        run_id,
        0,
        status="completed",
        idempotency_key=key,
        provider_run_id=turn,
        start_claimed_at=None,
        finished_at=done_at,
        updated_at=done_at,
    )
    stale = StartCall(request, "scripted", T0)
    releasing.release_refused_start(
        settings, Executor(settings, None), T0 + timedelta(seconds=10), run_id, 0, stale, turn
    )
    step = steps_of(settings, run_id)[0]
    assert (step.turn_stop, step.updated_at, step.provider_run_id) == (None, done_at, turn)
    [row] = provider.turns(key)
    assert row["cancel_requested_at"] is None, "the stale execution stopped the step's turn"


def test_a_stale_start_whose_turn_has_ended_stops_and_writes_nothing(
    settings: Settings,
) -> None:
    """Chaos finding (a one-way cut, full profile on Redis, 2026-12-03): a retried step's
    attempt 2 started just before its worker's answers were cut. The re-armed execution saw
    that attempt's turn fail and moved the step to attempt 3; the stale execution then got its
    answers, found the run moved, took its turn for an orphan, stopped it and wrote the stop
    on the step it no longer owned. The status right after the start had said the turn ended:
    there is nothing to stop and nothing to write."""
    from orchestration.execution import releasing
    from orchestration.execution.starting import StartCall
    from orchestration.providers.base import ProviderStatus, TurnStatus
    from orchestration.providers.scripted import ScriptedProvider
    from tests.unit.support import T0

    run_id, request, turn = _scripted_turn(settings, attempt=2)
    stale_key, provider = request.key, ScriptedProvider(settings)
    moved_at = T0 + timedelta(seconds=9)
    force_step(
        settings,
        run_id,
        0,
        status="running",
        attempt=3,
        idempotency_key=f"{run_id}:a:3",
        provider_run_id=None,
        start_claimed_at=moved_at,
        updated_at=moved_at,
    )
    failed = TurnStatus(ProviderStatus.FAILED, raw="failed")
    releasing.release_refused_start(
        settings,
        Executor(settings, None),
        T0 + timedelta(seconds=10),
        run_id,
        0,
        StartCall(request, "scripted", T0),
        turn,
        failed,
    )
    step = steps_of(settings, run_id)[0]
    assert (step.turn_stop, step.updated_at) == (None, moved_at)
    [row] = provider.turns(stale_key)
    assert row["cancel_requested_at"] is None, "the stale execution stopped an ended turn"


def test_a_start_that_reaches_the_provider_after_its_deadline_begins_no_turn(
    settings: Settings,
) -> None:
    """Chaos finding 8: a start sent just before a one-way cut reached the provider after the
    cancel's claim window had passed. The request carries its deadline (the claim's time plus
    one call's bound); the scripted provider refuses it on arrival, the engine reads that as
    an outage, and the next execution claims again with a new deadline and starts."""
    from orchestration.providers.scripted import EXPIRED, STARTED, ScriptedProvider
    from tests.unit.support import Clock, step_spec

    run_id = launch(settings, workflow(step_spec(with_={"states": [["running", 1000]]})))
    behind = utcnow() - timedelta(seconds=settings.provider_timeout + 1)
    outcome = Stepper(settings, Executor(settings, None), clock=lambda: behind).advance(
        run_id, 0, 0
    )
    assert isinstance(outcome, Poll)
    provider = ScriptedProvider(settings)
    assert [call["outcome"] for call in provider.start_calls(run_id + ":")] == [EXPIRED]
    assert provider.turns(run_id + ":") == []
    run, step = run_row(settings, run_id), steps_of(settings, run_id)[0]
    assert (run.status, run.park_reason) == ("parked", "platform_interrupt")
    assert "after its deadline" in (step.error or "") and step.start_claimed_at is None
    again = Stepper(settings, Executor(settings, None), clock=Clock(utcnow())).advance(
        run_id, 0, outcome.tick
    )
    assert isinstance(again, Poll)
    calls = provider.start_calls(run_id + ":")
    assert [call["outcome"] for call in calls] == [EXPIRED, STARTED]
    assert steps_of(settings, run_id)[0].provider_run_id is not None


def _scripted_turn(settings: Settings, *, attempt: int) -> tuple[str, Any, str]:
    """A launched run and a real scripted turn started for ``attempt`` of its step ``a``:
    the run id, the start request and the turn's id."""
    from orchestration.providers.base import TurnRequest
    from orchestration.providers.scripted import ScriptedProvider
    from tests.unit.support import step_spec

    run_id = launch(settings, workflow(step_spec()))
    request = TurnRequest(
        key=f"{run_id}:a:{attempt}",
        run_id=run_id,
        step_id="a",
        attempt=attempt,
        input="t",
        options={},
    )
    return run_id, request, ScriptedProvider(settings).start(request)
