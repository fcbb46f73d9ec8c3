"""The run engine through a real prefork worker: completion on ``idle``, timeouts, cancel in
every phase, duplicate delivery, idempotent launch, bad input and owner isolation."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from sqlalchemy import func, select

from chaos.duplicating import DuplicatingQueue
from orchestration.core.db import session_scope
from orchestration.core.errors import IdempotencyConflict, RunNotFound, ValidationError
from orchestration.core.models import Run, RunEvent, Step
from orchestration.providers.scripted import STARTED, ScriptedProvider
from orchestration.runs.chains import SEGMENT_LINKS
from orchestration.runtime.celery_queue import client_queue
from orchestration.runtime.processes import ManagedProcess, start_worker
from orchestration.service import Orchestrator
from tests.conftest import wait_for
from tests.integration.conftest import Stack
from tests.support.runs import finished

pytestmark = pytest.mark.integration


def flow(*steps: dict[str, Any], name: str = "t") -> dict[str, Any]:
    return {"name": name, "steps": list(steps)}


def step(states: list[list[Any]], **extra: Any) -> dict[str, Any]:
    options = {"states": states, **extra.pop("with", {})}
    return {
        "id": extra.pop("id", "s1"),
        "provider": "scripted",
        "task": extra.pop("task", "go"),
        "poll_interval": 0.1,
        "max_poll_interval": 0.5,
        "with": options,
        **extra,
    }


def test_step_that_settles_idle_completes(
    worker: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    started = time.perf_counter()
    run = orch.launch(
        flow(step([["running", 0.3], ["idle"]], **{"with": {"output": {"a": 1}}})),
        owner=owner,
    )
    done = finished(orch, run.id, owner)
    assert (done.status, done.stop_reason, done.result) == ("completed", "completed", {"a": 1})
    assert done.steps[0].last_provider_status == "idle"
    assert len(stack.turns(run.id)) == 1
    print(f"launch-to-completion: {time.perf_counter() - started:.3f}s")


def test_outputs_pass_to_later_steps_through_the_database(
    worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(
        flow(
            step([["completed"]], id="a", **{"with": {"output": {"n": 41}}}),
            step(
                [["completed"]],
                id="b",
                task={"prev": "{{ steps.a.output.n }}", "q": "ask {{ args.q }}"},
            ),
        ),
        {"q": "why"},
        owner=owner,
    )
    done = finished(orch, run.id, owner)
    assert done.status == "completed"
    assert done.steps[1].input == {"prev": 41, "q": "ask why"}
    assert done.result == {"prev": 41, "q": "ask why"}


def test_a_long_run_with_polling_steps_completes_through_its_segments(
    worker: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    """More steps than a chain segment holds, every other one polling: a poll's retry drops
    the rest of its segment, so the run completes only if the step that finishes it arms
    the next segment, on a real worker (the unit tier plays the broker by hand)."""
    steps = [
        step([["running", 0.2], ["completed"]] if i % 2 else [["completed"]], id=f"s{i}")
        for i in range(2 * SEGMENT_LINKS + 2)
    ]
    steps[-1]["task"] = "{{ steps.s0.output }}"
    run = orch.launch(flow(*steps), owner=owner)
    done = finished(orch, run.id, owner, timeout=90)
    assert (done.status, done.stop_reason) == ("completed", "completed"), done.error
    assert [s.status for s in done.steps] == ["completed"] * len(steps)
    assert len(stack.turns(run.id)) == len(steps)
    assert len(set(done.task_ids)) == len(done.task_ids) >= len(steps)


def test_step_whose_provider_never_finishes_times_out(
    worker: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    run = orch.launch(flow(step([["running"]], timeout=1.0)), owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.stop_reason) == ("timed_out", "step_timeout")
    assert done.steps[0].status == "timed_out"
    turn = wait_for(lambda: stack.turns(run.id)[0]["cancel_requested_at"], 5, what="turn cancel")
    assert turn is not None


def test_failed_turn_fails_step_and_run(
    worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(
        flow(step([["running", 0.2], ["failed"]], **{"with": {"error": "model refused"}})),
        owner=owner,
    )
    done = finished(orch, run.id, owner)
    assert (done.status, done.stop_reason) == ("failed", "step_failed")
    assert "model refused" in (done.error or "")
    assert done.steps[0].status == "failed"


def _start_calls(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    """Every ``start`` call the scripted provider saw for ``run_id``: a repeated start of a
    key, or one after a cancel, begins no new turn row, but it is a call all the same."""
    return ScriptedProvider(stack.settings).start_calls(run_id + ":")


def _no_turn_starts_after(stack: Stack, run_id: str, started_before: int) -> None:
    """No ``start`` call came after the run's cancel request, and the ``started_before`` calls
    before it each began a turn. The cancel's moment is its ``cancelling`` journal row: the
    canceller's clock read before it took the run row's lock, so earlier than its commit; a
    start between the two would be one the cancel waited for, and these tests have none (the
    only turn started seconds before the cancel)."""
    time.sleep(1.0)  # long enough for a stray countdown message (poll interval 0.1-0.5 s)
    with session_scope(stack.settings.database_url) as session:
        cancelled_at = session.scalars(
            select(RunEvent.at)
            .where(
                RunEvent.run_id == run_id,
                RunEvent.step_id.is_(None),
                RunEvent.to_status == "cancelling",
            )
            .order_by(RunEvent.id)
        ).first()
    assert cancelled_at is not None, "the run was never cancelling"
    calls = _start_calls(stack, run_id)
    late = [call for call in calls if call["called_at"] >= cancelled_at]
    assert late == [], f"start calls after the cancel at {cancelled_at}: {late}"
    assert [call["outcome"] for call in calls] == [STARTED] * started_before, calls


def test_cancel_during_countdown_wait(
    worker: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    run = orch.launch(
        flow(step([["running"]], poll_interval=1.0, max_poll_interval=2.0)), owner=owner
    )
    wait_for(lambda: orch.get(run.id, owner=owner).steps[0].polls >= 2, 15, what="polling")
    started = time.perf_counter()
    record = orch.cancel(run.id, owner=owner)
    elapsed = time.perf_counter() - started
    assert (record.status, record.stop_reason) == ("cancelled", "cancel_requested")
    assert record.steps[0].status == "cancelled"
    assert stack.turns(run.id)[0]["cancel_requested_at"] is not None
    _no_turn_starts_after(stack, run.id, 1)
    print(f"cancel-to-terminal-row: {elapsed:.3f}s")


def test_cancel_during_a_poll_kills_the_prefork_process(
    worker: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    # Each status call blocks 2.5 s, so the poll execution is in flight when cancel lands.
    run = orch.launch(flow(step([["running"]], **{"with": {"poll_delay": 2.5}})), owner=owner)
    record = wait_for(
        lambda: (r := orch.get(run.id, owner=owner)).steps[0].polls >= 2 and r,
        15,
        what="a poll in flight",
    )
    pid = record.steps[0].worker_pid
    assert pid is not None and pid != worker.pid
    cancelled = orch.cancel(run.id, owner=owner)
    assert cancelled.status == "cancelled"

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, 10, what=f"prefork child {pid} gone")
    _no_turn_starts_after(stack, run.id, 1)


def test_cancel_before_the_first_step_starts(
    worker: ManagedProcess, stack: Stack, owner: str
) -> None:
    # The chain goes to a queue no worker consumes yet: the run is durably queued.
    parked_settings = stack.settings.model_copy(update={"queue": stack.settings.queue + "-later"})
    orch = Orchestrator(parked_settings, client_queue(parked_settings))
    run = orch.launch(flow(step([["completed"]])), owner=owner)
    record = orch.cancel(run.id, owner=owner)
    assert (record.status, record.steps[0].status) == ("cancelled", "cancelled")
    # A worker that never saw the revoke now gets the message: the row stops it.
    task_id = record.steps[0].celery_task_id
    assert task_id is not None
    late = start_worker(
        stack.env, stack.folder / "late.log", name="late", extra=("-Q", parked_settings.queue)
    )
    try:
        late.wait_for_log("ready.", timeout=60)
        wait_for(lambda: f"{task_id}] ignored" in late.log(), 20, what="late worker ignored it")
    finally:
        late.stop()
    assert _start_calls(stack, run.id) == []
    assert orch.get(run.id, owner=owner).status == "cancelled"


def test_duplicate_delivery_starts_one_turn(
    worker: ManagedProcess, stack: Stack, owner: str
) -> None:
    orch = Orchestrator(stack.settings, DuplicatingQueue(client_queue(stack.settings)))
    run = orch.launch(
        flow(step([["running", 0.5], ["completed"]], id="a"), step([["completed"]], id="b")),
        owner=owner,
    )
    done = finished(orch, run.id, owner)
    assert done.status == "completed"
    assert len(stack.turns(run.id)) == 2  # one per step
    calls = _start_calls(stack, run.id)
    assert [(c["key"], c["outcome"]) for c in calls] == [  # one call per step: the fence held
        (f"{run.id}:a:1", STARTED),
        (f"{run.id}:b:1", STARTED),
    ], calls
    with session_scope(stack.settings.database_url) as session:
        completions = session.scalar(
            select(func.count())
            .select_from(RunEvent)
            .where(RunEvent.run_id == run.id, RunEvent.to_status == "completed")
        )
    assert completions == 3  # two steps and the run, each once


def test_same_request_id_gives_one_run_and_conflicts_are_errors(
    worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    workflow = flow(step([["completed"]]))
    first = orch.launch(workflow, {"x": 1}, owner=owner, request_id="req-1")
    again = orch.launch(workflow, {"x": 1}, owner=owner, request_id="req-1")
    assert again.id == first.id
    with pytest.raises(IdempotencyConflict, match="req-1"):
        orch.launch(workflow, {"x": 2}, owner=owner, request_id="req-1")
    assert len(orch.list(owner=owner)) == 1


@pytest.mark.parametrize(
    ("workflow", "args", "field"),
    [
        ({"name": "x", "steps": []}, {}, "steps"),
        ({"name": "x", "steps": [{"id": "bad id", "provider": "scripted"}]}, {}, "steps[0].id"),
        ({"name": "x", "steps": [{"id": "a", "provider": "nope"}]}, {}, "steps[0].provider"),
        (
            {
                "name": "x",
                "steps": [{"id": "a", "provider": "scripted"}, {"id": "a", "provider": "scripted"}],
            },
            {},
            "steps",
        ),
        (
            {
                "name": "x",
                "steps": [{"id": "a", "provider": "scripted", "with": {"states": [["flying"]]}}],
            },
            {},
            "steps[0].with.states[0]",
        ),
        (
            {
                "name": "x",
                "steps": [{"id": "a", "provider": "scripted", "task": "{{ args.missing }}"}],
            },
            {},
            "steps[0].task",
        ),
        ({"name": "x", "steps": [{"id": "a", "provider": "scripted"}]}, [1, 2], "args"),
        ("not a mapping", {}, "workflow"),
    ],
)
def test_malformed_input_is_a_clear_error_and_writes_nothing(
    stack: Stack, orch: Orchestrator, owner: str, workflow: Any, args: Any, field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        orch.launch(workflow, args, owner=owner)
    assert caught.value.field == field
    with session_scope(stack.settings.database_url) as session:
        assert session.scalar(select(func.count()).select_from(Run).where(Run.owner == owner)) == 0
        assert (
            session.scalar(
                select(func.count()).select_from(Step).join(Run).where(Run.owner == owner)
            )
            == 0
        )


def test_one_owner_cannot_read_or_cancel_anothers_run(
    worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(flow(step([["running", 1.0], ["completed"]])), owner=owner)
    with pytest.raises(RunNotFound):
        orch.get(run.id, owner="intruder")
    with pytest.raises(RunNotFound):
        orch.cancel(run.id, owner="intruder")
    assert orch.list(owner="intruder") == []
    assert finished(orch, run.id, owner).status == "completed"
