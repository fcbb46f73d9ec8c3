"""Approval steps through a real prefork worker and beat (issue 12): no worker waits while a
run waits for a decision; approved, the next step runs; expired, the beat's sweeper applies
``on_expiry``; a decision racing the expiry settles the step exactly once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import select

from orchestration.core.db import session_scope
from orchestration.core.errors import ConflictError
from orchestration.core.models import RunEvent
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from tests.conftest import wait_for
from tests.integration.conftest import Stack
from tests.support.runs import finished

pytestmark = pytest.mark.integration


def _flow(expires_in: float, on_expiry: str = "reject") -> dict[str, Any]:
    return {
        "name": "approve",
        "steps": [
            {
                "id": "review",
                "approval": {
                    "prompt": "Ship {{ args.what }}?",
                    "expires_in": expires_in,
                    "on_expiry": on_expiry,
                },
            },
            {
                "id": "ship",
                "provider": "scripted",
                "task": "{{ steps.review.output.decision }}",
                "poll_interval": 0.1,
                "with": {"states": [["completed"]]},
            },
        ],
    }


def _parked(orch: Orchestrator, run_id: str, owner: str) -> None:
    wait_for(
        lambda: orch.get(run_id, owner=owner).park_reason == "approval",
        20,
        interval=0.05,
        what="the run parked for its approval",
    )


def test_no_worker_waits_and_an_approval_moves_the_run_on(
    worker: ManagedProcess, beat: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(_flow(300), {"what": "v2"}, owner=owner)
    _parked(orch, run.id, owner)
    executions = orch.get(run.id, owner=owner).steps[0].polls
    time.sleep(2.0)
    parked = orch.get(run.id, owner=owner)
    assert parked.steps[0].polls == executions, "nothing executes while it waits"
    assert parked.steps[0].prompt == "Ship v2?"
    orch.approve(run.id, "review", owner=owner, comment="go")
    done = finished(orch, run.id, owner)
    assert (done.status, done.result) == ("completed", "approved")
    assert done.steps[0].output["comment"] == "go"


def test_an_expired_approval_is_closed_by_the_beat_within_its_deadline(
    worker: ManagedProcess, beat: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(_flow(1.5, on_expiry="fail"), {"what": "v3"}, owner=owner)
    _parked(orch, run.id, owner)
    parked = orch.get(run.id, owner=owner)
    done = finished(orch, run.id, owner, timeout=20)
    assert (done.status, done.stop_reason) == ("failed", "approval_expired")
    assert done.steps[0].output["decision"] == "expired"
    assert parked.waiting_until is not None and parked.deadline_at is not None
    assert done.finished_at is not None
    assert parked.waiting_until <= done.finished_at <= parked.deadline_at
    print(f"closed {(done.finished_at - parked.waiting_until).total_seconds():.3f}s after expiry")


def test_a_decision_racing_the_expiry_settles_the_step_once(
    worker: ManagedProcess, beat: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    runs = [orch.launch(_flow(2.0), {"what": f"r{n}"}, owner=owner) for n in range(6)]
    for run in runs:
        _parked(orch, run.id, owner)
    expiries = {run.id: orch.get(run.id, owner=owner).waiting_until for run in runs}

    def race(index: int, run_id: str) -> str:
        at = expiries[run_id]
        assert at is not None
        # Decide around the expiry: some a little before, some at it, some after.
        wait = (at - datetime.now(at.tzinfo)).total_seconds() + (index - 3) * 0.15
        time.sleep(max(0.0, wait))
        try:
            orch.approve(run_id, "review", owner=owner)
        except ConflictError:
            return "conflict"
        return "approved"

    with ThreadPoolExecutor(len(runs)) as pool:
        answers = list(pool.map(lambda pair: race(*pair), enumerate(r.id for r in runs)))
    for run, answer in zip(runs, answers, strict=True):
        done = finished(orch, run.id, owner, timeout=20)
        decision = done.steps[0].output["decision"]
        assert (answer, decision, done.status) in (
            ("approved", "approved", "completed"),
            ("conflict", "expired", "failed"),
        ), (answer, done.steps[0].output, done.status)
        with session_scope(stack.settings.database_url) as session:
            left = session.scalars(
                select(RunEvent).where(
                    RunEvent.run_id == run.id,
                    RunEvent.step_id == "review",
                    RunEvent.from_status == "parked",
                )
            ).all()
        assert len(left) == 1, "the step left its park once"
    print(f"race outcomes: {answers}")
    assert "approved" in answers and "conflict" in answers, answers
