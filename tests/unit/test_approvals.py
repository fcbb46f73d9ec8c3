"""Approval steps (issue 12): ``approval: {prompt, expires_in, on_expiry}``.

The step parks the run (no worker waits); a decision or the sweeper at the expiry settles it
once, the first commit winning and the other getting a clear conflict; the output is
``{decision, by, comment, at}``; a rejection fails the run ``approval_rejected``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from orchestration.core import deadlines
from orchestration.core.errors import ConflictError, LimitExceeded, RunNotFound, ValidationError
from orchestration.core.settings import Settings
from orchestration.execution import Halt, Proceed, Stepper
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.upkeep.sweeper import Sweeper
from orchestration.workflows.parsing import parse
from tests.unit.support import T0, Clock, RecordingDispatcher, launch, run_row, step_spec, steps_of


def _flow(on_expiry: str = "reject", expires_in: float = 60) -> dict[str, Any]:
    return {
        "name": "publish",
        "steps": [
            {
                "id": "review",
                "approval": {
                    "prompt": "Publish {{ args.title }}?",
                    "expires_in": expires_in,
                    "on_expiry": on_expiry,
                },
            },
            step_spec(
                "publish",
                task="{{ steps.review.output.decision }}",
                with_={"states": [["completed"]]},
            ),
        ],
    }


def _parked(settings: Settings, clock: Clock, **flow: Any) -> str:
    run_id = launch(settings, _flow(**flow), {"title": "the report"}, now=clock.now)
    stepper = Stepper(settings, Executor(settings, None), clock=clock, worker="unit", pid=1)
    assert stepper.advance(run_id, 0, 0) == Halt("waiting for a decision")
    return run_id


def _orch(settings: Settings, clock: Clock) -> Orchestrator:
    return Orchestrator(settings, RecordingDispatcher(), clock=clock)


def test_an_approval_parks_the_run_until_its_expiry_and_no_worker_waits(
    settings: Settings,
) -> None:
    clock = Clock(T0)
    run_id = _parked(settings, clock)
    run, step = run_row(settings, run_id), steps_of(settings, run_id)[0]
    assert (run.status, run.park_reason, step.status) == ("parked", "approval", "parked")
    assert step.prompt == step.input == "Publish the report?"
    assert run.waiting_until == T0 + timedelta(seconds=60)
    assert run.deadline_at == run.waiting_until + timedelta(
        seconds=deadlines.slack_seconds(settings)
    )
    # A second delivery of the step message halts without writing: nothing polls.
    stepper = Stepper(settings, Executor(settings, None), clock=clock, worker="unit", pid=1)
    assert isinstance(stepper.advance(run_id, 0, 1), Halt)
    said = _orch(settings, clock).explain(run_id, owner="owner-1")
    assert "waiting for a decision on 'Publish the report?'" in said["why"]
    assert f"orchestration approve {run_id} --step review" in said["next"]


def test_approved_the_run_moves_on_with_the_decision_as_the_step_output(
    settings: Settings,
) -> None:
    clock = Clock(T0)
    run_id = _parked(settings, clock)
    clock.advance(5)
    record = _orch(settings, clock).approve(
        run_id, "review", owner="owner-1", comment="looks right"
    )
    review = record.steps[0]
    assert (record.status, review.status) == ("running", "completed")
    assert review.output == {
        "decision": "approved",
        "by": "owner-1",
        "comment": "looks right",
        "at": clock.now.isoformat(),
    }
    stepper = Stepper(settings, Executor(settings, None), clock=clock, worker="unit", pid=1)
    assert stepper.advance(run_id, 1, 0) == Proceed()
    assert run_row(settings, run_id).result == "approved"


def test_rejected_the_run_fails_approval_rejected(settings: Settings) -> None:
    clock = Clock(T0)
    run_id = _parked(settings, clock)
    record = _orch(settings, clock).approve(
        run_id, "review", owner="owner-1", approve=False, comment="not yet"
    )
    assert (record.status, record.stop_reason) == ("failed", "approval_rejected")
    assert record.error == "step review: rejected by owner-1: not yet"
    assert record.steps[0].output["decision"] == "rejected"
    assert record.steps[1].status == "skipped"


@pytest.mark.parametrize(
    ("on_expiry", "status", "stop_reason"),
    [
        ("reject", "failed", "approval_rejected"),
        ("fail", "failed", "approval_expired"),
        ("approve", "running", None),
    ],
)
def test_the_sweeper_applies_on_expiry_at_the_expiry_and_not_before(
    settings: Settings, on_expiry: str, status: str, stop_reason: str | None
) -> None:
    clock = Clock(T0)
    run_id = _parked(settings, clock, on_expiry=on_expiry)
    sweeper = Sweeper(settings, Executor(settings, RecordingDispatcher()))
    assert sweeper.sweep(T0 + timedelta(seconds=59.9))["approvals_expired"] == 0
    assert run_row(settings, run_id).status == "parked"
    assert sweeper.sweep(T0 + timedelta(seconds=60))["approvals_expired"] == 1
    run, step = run_row(settings, run_id), steps_of(settings, run_id)[0]
    assert (run.status, run.stop_reason) == (status, stop_reason)
    assert step.output["decision"] == "expired" and step.output["applied"] == on_expiry
    assert sweeper.sweep(T0 + timedelta(seconds=61))["approvals_expired"] == 0, "once"


def test_a_decision_at_or_after_the_expiry_is_a_conflict(settings: Settings) -> None:
    clock = Clock(T0)
    run_id = _parked(settings, clock)
    clock.advance(60)
    with pytest.raises(ConflictError, match="expired at"):
        _orch(settings, clock).approve(run_id, "review", owner="owner-1")
    Sweeper(settings, Executor(settings, RecordingDispatcher())).sweep(clock.now)
    with pytest.raises(ConflictError, match="not waiting for a decision"):
        _orch(settings, clock).approve(run_id, "review", owner="owner-1")
    assert run_row(settings, run_id).stop_reason == "approval_rejected"


def test_a_second_decision_is_a_conflict_and_changes_nothing(settings: Settings) -> None:
    clock = Clock(T0)
    run_id = _parked(settings, clock)
    orch = _orch(settings, clock)
    orch.approve(run_id, "review", owner="owner-1", approve=False)
    with pytest.raises(ConflictError, match=r"\(it was rejected\)"):
        orch.approve(run_id, "review", owner="owner-1")
    assert run_row(settings, run_id).stop_reason == "approval_rejected"


def test_another_owner_cannot_decide(settings: Settings) -> None:
    clock = Clock(T0)
    run_id = _parked(settings, clock)
    with pytest.raises(RunNotFound):
        _orch(settings, clock).approve(run_id, "review", owner="owner-2")
    with pytest.raises(ValidationError, match="not an approval step"):
        _orch(settings, clock).approve(run_id, "publish", owner="owner-1")
    assert run_row(settings, run_id).status == "parked"


@pytest.mark.parametrize(
    ("step", "field", "error"),
    [
        ({"id": "r", "approval": {"expires_in": 10}, "provider": "scripted"}, "steps[0]", None),
        ({"id": "r", "approval": {"expires_in": 700000}}, "steps[0].approval.expires_in", 1),
        ({"id": "r", "approval": {"expires_in": 0}}, "steps[0].approval.expires_in", None),
        (
            {"id": "r", "approval": {"expires_in": 9, "on_expiry": "x"}},
            "steps[0].approval.on_expiry",
            None,
        ),
        (
            {"id": "r", "approval": {"expires_in": 9, "prompt": "{{ args.nope }}"}},
            "steps[0].approval.prompt",
            None,
        ),
        ({"id": "r"}, "steps[0]", None),
    ],
)
def test_a_bad_approval_is_refused_naming_its_field(
    settings: Settings, step: dict[str, Any], field: str, error: int | None
) -> None:
    with pytest.raises(LimitExceeded if error else ValidationError) as caught:
        parse({"name": "w", "steps": [step]}, settings, args={})
    assert caught.value.field == field  # type: ignore[attr-defined]
