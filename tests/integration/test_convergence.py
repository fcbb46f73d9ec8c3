"""Every run converges, with a real beat and real workers that die: each scenario ends in a
terminal row by the ``deadline_at`` the run stated when the fault happened."""

from __future__ import annotations

import ast
import itertools
import re
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from orchestration.core.db import session_scope, utcnow
from orchestration.core.models import RunEvent
from orchestration.reads.records import RunRecord
from orchestration.runtime.celery_config import SWEEP_TASK
from orchestration.runtime.celery_queue import client_queue
from orchestration.runtime.processes import ManagedProcess, celery_argv, start_worker
from orchestration.service import Orchestrator, is_terminal
from tests.conftest import wait_for
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

#: Clock skew and scheduling slack allowed between the test process and the stack.
SLACK = timedelta(seconds=1.5)

#: Runs queued behind a held key in the two-beats test: each costs every sweeper pass a
#: transaction, which makes a pass last long enough for two beats' passes to overlap.
QUEUED_LOAD = 60


def one_step(states: list[list[Any]], **extra: Any) -> dict[str, Any]:
    options = {"states": states, **extra.pop("with", {})}
    return {
        "name": extra.pop("name", "conv"),
        "steps": [
            {
                "id": "s1",
                "provider": "scripted",
                "task": "go",
                "poll_interval": 0.2,
                "max_poll_interval": 1.0,
                "with": options,
                **extra,
            }
        ],
    }


def terminal(orch: Orchestrator, run_id: str, owner: str, timeout: float = 40) -> RunRecord:
    record: RunRecord = wait_for(
        lambda: (r := orch.get(run_id, owner=owner)) and is_terminal(r) and r,
        timeout,
        interval=0.1,
        what=f"run {run_id} terminal",
    )
    return record


def journal(stack: Stack, run_id: str) -> list[RunEvent]:
    with session_scope(stack.settings.database_url) as session:
        rows = session.scalars(
            select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.id)
        ).all()
        session.expunge_all()
        return list(rows)


def first_event_after(stack: Stack, run_id: str, after: datetime) -> RunEvent:
    return next(e for e in journal(stack, run_id) if e.step_id is None and e.at > after)


@pytest.fixture()
def workers(stack: Stack) -> Iterator[list[ManagedProcess]]:
    """Workers this test starts (and may kill); all stopped at the end."""
    started: list[ManagedProcess] = []
    yield started
    for process in started:
        if process in stack.processes:
            stack.processes.remove(process)
        process.stop()


def redis_broker(stack: Stack) -> bool:
    return stack.settings.broker_url.startswith("redis")


def kill(process: ManagedProcess) -> None:
    process.signal(signal.SIGKILL)
    process.proc.wait(10)


def test_worker_killed_while_step_waits_on_countdown_is_rearmed(
    stack: Stack,
    beat: ManagedProcess,
    orch: Orchestrator,
    owner: str,
    workers: list[ManagedProcess],
) -> None:
    workers.append(stack.start_worker("doomed"))
    run = orch.launch(
        one_step([["running", 6.0], ["completed"]], poll_interval=1.5, max_poll_interval=2.0),
        owner=owner,
    )
    wait_for(lambda: orch.get(run.id, owner=owner).steps[0].polls >= 2, 20, what="polling")
    kill(workers[0])
    killed_at = utcnow()
    stated = orch.get(run.id, owner=owner).deadline_at
    assert stated is not None
    workers.append(stack.start_worker("survivor"))
    done = terminal(orch, run.id, owner)
    assert (done.status, done.stop_reason) == ("completed", "completed")
    # Redis keeps the dead worker's countdown message until the visibility timeout, so the
    # sweeper re-arms the run; RabbitMQ requeues it at once and the survivor carries on.
    moved = first_event_after(stack, run.id, killed_at)
    assert moved.at <= stated + SLACK, f"nothing moved the run by its deadline: {moved}"
    if redis_broker(stack):
        assert moved.to_status == "parked" and "re-armed" in moved.cause
        assert done.rearms == 1


def test_graceful_cancel_with_a_dead_worker_is_enforced(
    stack: Stack,
    beat: ManagedProcess,
    orch: Orchestrator,
    owner: str,
    workers: list[ManagedProcess],
) -> None:
    workers.append(stack.start_worker("doomed2"))
    run = orch.launch(one_step([["running"]], poll_interval=1.0), owner=owner)
    wait_for(lambda: orch.get(run.id, owner=owner).steps[0].polls >= 2, 20, what="polling")
    kill(workers[0])
    record = orch.cancel(run.id, owner=owner, graceful=True)
    assert record.status == "cancelling" and record.deadline_at is not None
    workers.append(stack.start_worker("sweeps"))
    done = terminal(orch, run.id, owner)
    # On RabbitMQ the requeued step message honours the cancel before the sweeper must.
    expected = (
        {"cancel_enforced"} if redis_broker(stack) else {"cancel_enforced", "cancel_requested"}
    )
    assert done.status == "cancelled" and done.stop_reason in expected
    assert done.finished_at is not None and done.finished_at <= record.deadline_at + SLACK
    # The sweeper makes no provider call: the stop task cancels the turn after the pass.
    wait_for(lambda: stack.turns(run.id)[0]["cancel_requested_at"], 20, what="turn cancel")
    stop = wait_for(lambda: orch.get(run.id, owner=owner).steps[0].turn_stop, 20, what="stop")
    assert stop["status"] in ("pending", "stopped")


def test_graceful_cancel_with_a_live_worker_stops_cooperatively(
    stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(one_step([["running"]]), owner=owner)
    wait_for(lambda: orch.get(run.id, owner=owner).steps[0].polls >= 2, 20, what="polling")
    record = orch.cancel(run.id, owner=owner, graceful=True)
    assert record.status == "cancelling"
    done = terminal(orch, run.id, owner, timeout=10)
    assert (done.status, done.stop_reason) == ("cancelled", "cancel_requested")
    assert any("honoured by the step" in e.cause for e in journal(stack, run.id))


def test_human_park_never_answered_times_out_by_its_deadline(
    stack: Stack, worker: ManagedProcess, beat: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(
        one_step([["running", 0.2], ["input_required"]], **{"with": {"prompt": "approve?"}}),
        owner=owner,
    )
    parked = wait_for(
        lambda: (r := orch.get(run.id, owner=owner)).status == "parked" and r, 15, what="park"
    )
    assert parked.park_reason == "human" and parked.steps[0].prompt == "approve?"
    assert parked.health == "waiting" and parked.deadline_at is not None
    done = terminal(orch, run.id, owner)
    assert (done.status, done.stop_reason) == ("timed_out", "park_expired")
    assert done.finished_at is not None and done.finished_at <= parked.deadline_at + SLACK


def test_answer_resumes_a_human_park(
    stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(one_step([["running", 0.2], ["input_required"]]), owner=owner)
    wait_for(lambda: orch.get(run.id, owner=owner).status == "parked", 15, what="park")
    orch.answer(run.id, "s1", {"approved": True}, owner=owner)
    done = terminal(orch, run.id, owner)
    assert (done.status, done.result) == ("completed", {"approved": True})
    assert done.steps[0].attempt == 2
    assert [t["key"].rsplit(":", 1)[1] for t in stack.turns(run.id)] == ["1", "2"]


def test_rate_limit_park_resumes_when_reset_passes(
    stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(
        one_step(
            [["running", 0.2], ["rate_limited", 1.5], ["completed"]],
            **{"with": {"reset_after": 1.5}},
        ),
        owner=owner,
    )
    parked = wait_for(
        lambda: (r := orch.get(run.id, owner=owner)).status == "parked" and r, 15, what="park"
    )
    assert parked.park_reason == "engine_limit" and parked.waiting_until is not None
    done = terminal(orch, run.id, owner)
    assert done.status == "completed"
    assert done.parked_since is None


def test_rate_limit_park_past_its_budget_times_out(
    stack: Stack, worker: ManagedProcess, beat: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(
        one_step([["running", 0.2], ["rate_limited"]], **{"with": {"reset_after": 0.5}}),
        owner=owner,
    )
    parked = wait_for(
        lambda: (r := orch.get(run.id, owner=owner)).status == "parked" and r, 15, what="park"
    )
    done = terminal(orch, run.id, owner)
    assert (done.status, done.stop_reason) == ("timed_out", "park_expired")
    assert parked.deadline_at is not None
    assert done.finished_at is not None and done.finished_at <= parked.deadline_at + SLACK


def test_checkpoint_effect_that_always_fails_does_not_leave_the_run_waiting(
    stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(
        one_step([["completed"]], **{"with": {"checkpoint_fails": True}}), owner=owner
    )
    done = terminal(orch, run.id, owner)
    assert (done.status, done.stop_reason) == ("failed", "effect_failed")
    assert "checkpoint effect failed 3 times" in (done.error or "")
    statuses = [e.to_status for e in journal(stack, run.id) if e.step_id is None]
    assert "waiting" in statuses


@contextmanager
def sweeper_paused(stack: Stack) -> Iterator[None]:
    """Pause every beat of the module (a frozen beat holds nothing): with a sweeper running,
    a holder whose worker died is re-armed within a second and is never stalled for long."""
    beats = [p for p in stack.processes if "beat" in p.argv]
    for beat in beats:
        beat.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for beat in beats:
            beat.signal(signal.SIGCONT)


def test_claim_taken_over_from_a_dead_holder(
    stack: Stack,
    orch: Orchestrator,
    owner: str,
    workers: list[ManagedProcess],
) -> None:
    # The holder runs on a queue only its own worker consumes: the module's shared worker
    # must not pick its step up, or losing "holder-host" would not lose the holder.
    apart = stack.settings.model_copy(update={"queue": stack.settings.queue + "-holder"})
    with sweeper_paused(stack):
        workers.append(
            start_worker(
                stack.env,
                stack.folder / "holder-host.log",
                name="holder-host",
                extra=("-Q", apart.queue),
            )
        )
        workers[0].wait_for_log("ready.", timeout=60)
        holder = Orchestrator(apart, client_queue(apart)).launch(
            one_step([["running"]], poll_interval=1.0), owner=owner, concurrency_key="repo-1"
        )
        wait_for(lambda: orch.get(holder.id, owner=owner).steps[0].polls >= 2, 20, what="polling")
        # The holder's worker must lose the run without its message coming back: Redis keeps a
        # killed worker's message until the visibility timeout; RabbitMQ requeues it at once, so
        # there the worker is frozen instead (a SIGSTOP'd writer on SQLite would freeze the whole
        # database, which is why the freeze is not used everywhere).
        frozen = not redis_broker(stack)
        if frozen:
            workers[0].signal(signal.SIGSTOP)
        else:
            kill(workers[0])
        wait_for(lambda: orch.get(holder.id, owner=owner).health == "stalled", 20, what="stalled")
        taker = orch.launch(
            one_step([["running", 0.3], ["completed"]]), owner=owner, concurrency_key="repo-1"
        )
        assert taker.concurrency == "holding"
        displaced = orch.get(holder.id, owner=owner)
        assert (displaced.status, displaced.stop_reason) == ("interrupted", "displaced")
        assert displaced.needs_review
    # The sweeper is back: a frozen worker may hold the taker's first message (RabbitMQ
    # prefetch), and re-arming such a run is the sweeper's job.
    workers.append(stack.start_worker("taker-host"))
    assert terminal(orch, taker.id, owner).status == "completed"
    if frozen:
        # The frozen holder wakes up (a zombie resuming what it held): terminal is final.
        before = len(workers[0].log())
        workers[0].signal(signal.SIGCONT)
        wait_for(lambda: len(workers[0].log()) > before, 20, what="the woken worker to run")
    again = orch.get(holder.id, owner=owner)
    assert (again.status, again.stop_reason) == ("interrupted", "displaced")


@pytest.mark.parametrize("ending", ["cancelled", "failed", "swept"])
def test_enqueued_run_starts_when_its_holder_ends(
    stack: Stack,
    worker: ManagedProcess,
    beat: ManagedProcess,
    orch: Orchestrator,
    owner: str,
    ending: str,
) -> None:
    states = {
        "cancelled": [["running"]],
        "failed": [["running", 1.0], ["failed"]],
        "swept": [["running", 0.2], ["input_required"]],
    }[ending]
    holder = orch.launch(one_step(states), owner=owner, concurrency_key="k")
    queued = orch.launch(
        one_step([["completed"]]), owner=owner, concurrency_key="k", on_conflict="enqueue"
    )
    assert (queued.status, queued.concurrency, queued.health) == ("queued", "queued", "waiting")
    if ending == "cancelled":
        wait_for(lambda: orch.get(holder.id, owner=owner).steps[0].polls >= 1, 15)
        orch.cancel(holder.id, owner=owner)
    done = terminal(orch, queued.id, owner)
    assert done.status == "completed"
    assert (
        orch.get(holder.id, owner=owner).status
        == {"cancelled": "cancelled", "failed": "failed", "swept": "timed_out"}[ending]
    )


def test_reject_and_interrupt_policies(
    stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    from orchestration.core.errors import ConflictError

    holder = orch.launch(one_step([["running"]]), owner=owner, concurrency_key="sess")
    with pytest.raises(ConflictError, match="held by run"):
        orch.launch(one_step([["completed"]]), owner=owner, concurrency_key="sess")
    wait_for(lambda: orch.get(holder.id, owner=owner).steps[0].polls >= 1, 15)
    newer = orch.launch(
        one_step([["completed"]]), owner=owner, concurrency_key="sess", on_conflict="interrupt"
    )
    old = orch.get(holder.id, owner=owner)
    assert (old.status, old.stop_reason) == ("cancelled", "preempted")
    assert terminal(orch, newer.id, owner).status == "completed"
    wait_for(lambda: stack.turns(holder.id)[0]["cancel_requested_at"], 10, what="turn cancel")


#: A worker's log line for a finished sweeper pass; the pass returns its report, whose ``at``
#: (its start, on the worker's clock) and ``seconds`` give the pass's span.
_PASS_LINE = re.compile(
    rf"Task {re.escape(SWEEP_TASK)}\[(?P<id>[^\]]+)\] succeeded in \S+: (?P<report>\{{.*\}})$",
    re.MULTILINE,
)
#: A beat's DEBUG log line naming the id of a sweep it sent.
_SENT_LINE = re.compile(rf"{re.escape(SWEEP_TASK)} sent\. id->(?P<id>\S+)")


@dataclass(frozen=True)
class Pass:
    """One sweeper pass, by the beat that sent it."""

    beat: str
    start: float
    end: float
    parks_expired: int


def sweeper_passes(worker_log: str, beats: dict[str, ManagedProcess]) -> list[Pass]:
    """The passes the worker ran for ``beats``: each message's id is matched to the beat
    that logged sending it."""
    sent_by = {
        match["id"]: name
        for name, beat in beats.items()
        for match in _SENT_LINE.finditer(beat.log())
    }
    passes = []
    for match in _PASS_LINE.finditer(worker_log):
        if match["id"] in sent_by:
            report = ast.literal_eval(match["report"])
            start = datetime.fromisoformat(report["at"]).timestamp()
            passes.append(
                Pass(
                    sent_by[match["id"]], start, start + report["seconds"], report["parks_expired"]
                )
            )
    return passes


def overlapping(passes: list[Pass]) -> list[tuple[Pass, Pass]]:
    """Pairs of passes by different beats where each started before the other ended."""
    return [
        (a, b)
        for a, b in itertools.combinations(passes, 2)
        if a.beat != b.beat and a.start < b.end and b.start < a.end
    ]


def test_two_beats_close_each_run_once(
    stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    # The module's own beat is paused: the passes are those of two beats started together
    # (so in step) and logging at DEBUG the id of every sweep they send. A pass is fast, so
    # runs queued behind a held key (a write each, every pass) make it long enough that the
    # two beats' passes overlap whatever their phase; the test proves that they did.
    beats: dict[str, ManagedProcess] = {}
    holder = orch.launch(one_step([["running"]]), owner=owner, concurrency_key="load")
    load = [
        orch.launch(
            one_step([["completed"]]), owner=owner, concurrency_key="load", on_conflict="enqueue"
        )
        for _ in range(QUEUED_LOAD)
    ]
    # The two beats' sweeps go to a queue of their own, consumed by a worker with a free pool
    # process for each: a step task holding a shared pool process cannot serialise them.
    sweeps = {**stack.env, "ORCH_QUEUE": stack.settings.queue + "-sweeps"}
    sweeper_worker = start_worker(
        sweeps,
        stack.folder / "sweeps.log",
        concurrency=2,
        name="sweeps",
        extra=("-Q", sweeps["ORCH_QUEUE"]),
    )
    sweeper_worker.wait_for_log("ready.", timeout=60)
    try:
        with sweeper_paused(stack):
            for name in ("beat-a", "beat-b"):
                beats[name] = ManagedProcess(
                    celery_argv("beat", "-l", "DEBUG", "-s", str(stack.folder / f"{name}-s")),
                    sweeps,
                    stack.folder / f"{name}.log",
                )
            for beat in beats.values():
                beat.wait_for_log("beat: Starting", timeout=30)
            runs = [
                orch.launch(one_step([["running", 0.2], ["input_required"]]), owner=owner)
                for _ in range(4)
            ]
            parked = [
                wait_for(
                    lambda run=run: (r := orch.get(run.id, owner=owner)).status == "parked" and r,
                    20,
                    what="parked for a human",
                )
                for run in runs
            ]
            # Both beats are held while the parks expire, then let go together: each sends the
            # sweep it owes at once, so their passes start within milliseconds of each other
            # and both find the same expired parks (whatever the beats' phases were before).
            expiry = max(r.parked_since for r in parked if r.parked_since) + timedelta(
                seconds=stack.settings.park_budget_human + 0.5
            )
            for beat in beats.values():
                beat.signal(signal.SIGSTOP)
            wait_for(lambda: utcnow() > expiry, 30, what="the parks' budget")
            for beat in beats.values():
                beat.signal(signal.SIGCONT)
            for run in runs:
                assert terminal(orch, run.id, owner).stop_reason == "park_expired"
            # A pass that closed parks overlapped a pass of the other beat: both raced to close
            # the same runs. Not vacuous: if no such pair is in the worker's log, it fails.
            closing = wait_for(
                lambda: [
                    pair
                    for pair in overlapping(sweeper_passes(sweeper_worker.log(), beats))
                    if pair[0].parks_expired or pair[1].parks_expired
                ],
                5,
                what="a pass closing parks that overlapped a pass of the other beat",
            )
            print(f"overlapping passes: {closing[:3]}")
    finally:
        for beat in beats.values():
            beat.stop()
        sweeper_worker.stop()
        for run in [*load, holder]:
            orch.cancel(run.id, owner=owner)
    for run in runs:
        counts = Counter((e.step_id, e.to_status) for e in journal(stack, run.id))
        assert all(n == 1 for n in counts.values()), counts


def test_sweeper_liveness_is_visible(
    stack: Stack, worker: ManagedProcess, beat: ManagedProcess
) -> None:
    from orchestration.runtime.liveness import check

    report = wait_for(lambda: (r := check(stack.settings)) and r["ok"] and r, 15)
    assert report["checks"]["sweeper"]["age_seconds"] < 5


def test_metrics_show_no_run_past_its_deadline_after_the_scenarios(stack: Stack) -> None:
    """Runs last in the module: after every scenario above, ``/metrics`` reads 0 past-deadline
    runs, parsed with the Prometheus client's own parser."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from orchestration.surfaces.api.metrics import registry

    text = generate_latest(registry(stack.settings)).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    past = families["orchestration_runs_past_deadline"]
    assert [sample.value for sample in past.samples] == [0.0]
