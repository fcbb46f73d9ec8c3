"""Operators can stop an owner (issue 30): ``owners suspend NAME [--cancel-live]`` refuses the
owner's launches, reruns, schedule fires, registrations, answers, approvals, new fan-outs and
API tokens with one error naming the owner, since when and why; ``--cancel-live`` cancels its
live runs through the cancel path; ``resume`` lifts it; both are audited."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import OwnerSuspended
from orchestration.core.followups import Done
from orchestration.core.models import OwnerEvent, Run, ScheduleFire
from orchestration.core.settings import Settings
from orchestration.execution import Halt, Stepper
from orchestration.limits import suspensions
from orchestration.runs import owner_cancels
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.upkeep import schedules
from orchestration.workflows import registry
from tests.unit.support import (
    T0,
    Clock,
    RecordingDispatcher,
    cli,
    counts,
    drive,
    launch,
    run_row,
    step_spec,
    workflow,
)

OWNER = "acme"


@pytest.fixture
def orch(settings: Settings) -> Orchestrator:
    return Orchestrator(settings, RecordingDispatcher())


def _suspend(orch: Orchestrator, owner: str = OWNER, reason: str = "abuse report 42") -> None:
    orch.transact(
        lambda session: Done(
            suspensions.suspend(session, owner, utcnow(), reason=reason, by="operator alice")
        )
    )


def _resume(orch: Orchestrator, owner: str = OWNER) -> None:
    orch.transact(lambda session: Done(suspensions.resume(session, owner, utcnow(), by="bob")))


def _token(settings: Settings, owner: str | None, *, operator: bool = False) -> str:
    with session_scope(settings.database_url) as session:
        return tokens.create(session, owner, "ci", now=utcnow(), operator=operator)


def test_a_suspended_owners_launch_is_refused_naming_it_and_writes_nothing(
    orch: Orchestrator, settings: Settings
) -> None:
    _suspend(orch)
    before = counts(settings)
    with pytest.raises(OwnerSuspended) as refused:
        orch.launch(workflow(step_spec("a")), owner=OWNER, request_id="r1")
    message = str(refused.value)
    assert "owner 'acme' is suspended since" in message
    assert "abuse report 42" in message
    assert "orchestration owners resume acme" in message
    assert counts(settings) == before
    # Another owner is not touched; after resume the same request launches.
    assert orch.launch(workflow(step_spec("a")), owner="globex").status == "queued"
    _resume(orch)
    assert orch.launch(workflow(step_spec("a")), owner=OWNER, request_id="r1").status == "queued"


def test_a_rerun_and_a_registration_of_a_suspended_owner_are_refused(
    orch: Orchestrator, settings: Settings
) -> None:
    run = orch.launch(workflow(step_spec("a")), owner=OWNER)
    orch.cancel(run.id, owner=OWNER)
    _suspend(orch)
    with pytest.raises(OwnerSuspended):
        orch.rerun(run.id, owner=OWNER)
    with pytest.raises(OwnerSuspended):
        orch.register_workflow(workflow(step_spec("a"), name="daily"), owner=OWNER)
    assert orch.workflows(owner=OWNER) == []


def test_an_owner_token_of_a_suspended_owner_is_a_403_naming_it_and_operators_keep_working(
    orch: Orchestrator, settings: Settings
) -> None:
    app = create_app(orch)
    owner = TestClient(app, headers={"Authorization": f"Bearer {_token(settings, OWNER)}"})
    operator_token = _token(settings, None, operator=True)
    operator = TestClient(app, headers={"Authorization": f"Bearer {operator_token}"})
    run = owner.post("/runs", json={"workflow": workflow(step_spec("a"))}).json()
    _suspend(orch)
    for reply in (owner.get("/runs"), owner.post("/runs", json={"workflow": workflow()})):
        body = reply.json()["error"]
        assert (reply.status_code, body["code"]) == (403, "owner_suspended")
        assert "owner 'acme' is suspended since" in body["message"]
        assert "abuse report 42" in body["message"]
    assert operator.get(f"/operator/runs/{run['id']}").status_code == 200
    _resume(orch)
    assert owner.get("/runs").status_code == 200


def _scheduled() -> dict[str, Any]:
    return {"name": "nightly", "schedule": {"every": 10}, "steps": [step_spec("a")]}


def test_a_suspended_owners_schedule_fires_are_recorded_refused_and_launch_nothing(
    orch: Orchestrator,
) -> None:
    orch.transact(
        lambda session: Done(
            registry.register(session, orch.settings, OWNER, _scheduled(), T0, shared=False)
        )
    )
    _suspend(orch)
    report = schedules.fire(orch.transact, orch.settings, T0 + timedelta(seconds=25))
    assert (report["launched"], report["failed"]) == (0, 2)

    def read(session: Any) -> Done[list[tuple[str, str]]]:
        rows = session.scalars(select(ScheduleFire).order_by(ScheduleFire.fire_at))
        return Done([(row.status, row.reason or "") for row in rows])

    # One row for the two due fires (10 s and 20 s): a storm of fires writes one per pass.
    [(status, reason)] = orch.transact(read)
    assert status == "failed" and reason.startswith("owner suspended since")
    assert "abuse report 42" in reason and "the 1 due fires before this one" in reason
    assert orch.transact(lambda session: Done(session.scalar(select(Run.id)))) is None
    _resume(orch)
    report = schedules.fire(orch.transact, orch.settings, T0 + timedelta(seconds=31))
    assert report["launched"] == 1


def _approval() -> dict[str, Any]:
    return {
        "name": "publish",
        "steps": [
            {"id": "review", "approval": {"prompt": "ok?", "expires_in": 60}},
            step_spec("publish"),
        ],
    }


def test_an_approval_is_refused_while_a_rejection_still_ends_the_run(settings: Settings) -> None:
    clock = Clock(T0)
    run_id = launch(settings, _approval(), now=clock.now, owner=OWNER)
    stepper = Stepper(settings, Executor(settings, None), clock=clock, worker="unit", pid=1)
    assert stepper.advance(run_id, 0, 0) == Halt("waiting for a decision")
    orch = Orchestrator(settings, RecordingDispatcher(), clock=clock)
    _suspend(orch)
    with pytest.raises(OwnerSuspended):
        orch.approve(run_id, "review", owner=OWNER)
    assert run_row(settings, run_id).status == "parked"
    assert orch.approve(run_id, "review", owner=OWNER, approve=False).status == "failed"


def test_a_new_fan_out_of_a_suspended_owner_fails_its_run_naming_the_suspension(
    settings: Settings,
) -> None:
    clock = Clock(T0)
    fan = {
        "name": "fan",
        "steps": [{"id": "each", "for_each": "{{ args.items }}", "step": step_spec("one")}],
    }
    run_id = launch(settings, fan, {"items": [1, 2]}, now=clock.now, owner=OWNER)
    orch = Orchestrator(settings, RecordingDispatcher(), clock=clock)
    _suspend(orch)
    stepper = Stepper(settings, Executor(settings, None), clock=clock, worker="unit", pid=1)
    stepper.advance(run_id, 0, 0)
    row = run_row(settings, run_id)
    assert row.status == "failed"
    assert "owner 'acme' is suspended since" in (row.error or "")
    branches = orch.transact(
        lambda session: Done(session.scalar(select(Run.id).where(Run.parent_run_id == run_id)))
    )
    assert branches is None
    assert "is suspended since" in orch.explain(run_id, owner=OWNER)["why"]


def test_cancel_live_cancels_every_live_run_in_batches_naming_the_suspension(
    orch: Orchestrator, settings: Settings
) -> None:
    runs = [orch.launch(workflow(step_spec("a")), owner=OWNER).id for _ in range(5)]
    other = orch.launch(workflow(step_spec("a")), owner="globex").id
    _suspend(orch)
    # A live run of a suspended owner goes on; explain says what the suspension refuses.
    assert "its owner 'acme' is suspended since" in orch.explain(runs[0], owner=OWNER)["why"]
    held = orch.transact(lambda session: Done(suspensions.of(session, OWNER)))
    assert held is not None
    seen: list[int] = []
    cancelled = owner_cancels.cancel_live_runs(
        orch.transact, settings, held, clock=utcnow, batch=2, progress=seen.append
    )
    assert (cancelled, seen) == (5, [2, 4, 5])
    for run_id in runs:
        row = run_row(settings, run_id)
        assert (row.status, row.stop_reason) == ("cancelled", "cancel_requested")
        assert (row.cause or "").startswith("owner suspended: owner 'acme' suspended by")
        said = orch.explain(run_id, owner=OWNER)
        assert "cancelled when its owner was suspended" in said["why"]
    assert run_row(settings, other).status == "queued"

    def audit(session: Any) -> Done[list[tuple[str, Any]]]:
        rows = session.scalars(select(OwnerEvent).order_by(OwnerEvent.pk))
        return Done([(row.kind, row.detail) for row in rows])

    _resume(orch)
    assert orch.transact(audit) == [
        ("suspended", None),
        ("cancelled_live", {"cancelled": 5}),
        ("resumed", None),
    ]


def test_the_cli_suspends_lists_and_resumes_an_owner(settings: Settings, tmp_path: Path) -> None:
    run = cli(settings)
    done = run("owners", "suspend", OWNER, "--reason", "abuse [/x]", "--by", "operator al")
    assert done.returncode == 0, done.stderr
    assert "suspended owner acme since" in done.stdout
    assert "abuse [/x]" in done.stdout
    listed = run("owners", "suspended")
    assert "acme" in listed.stdout and "abuse [/x]" in listed.stdout
    flow = tmp_path / "flow.json"
    flow.write_text(json.dumps(workflow(step_spec("a"))))
    refused = cli(settings, owner=OWNER)("launch", str(flow), "--json")
    assert refused.returncode == 2
    assert json.loads(refused.stderr)["error"]["code"] == "owner_suspended"
    assert run("owners", "suspend", OWNER).stdout.startswith("already suspended")
    resumed = run("owners", "resume", OWNER)
    assert resumed.returncode == 0 and "resumed owner acme" in resumed.stdout
    assert "was not suspended" in run("owners", "resume", OWNER).stdout
    bad = run("owners", "suspend", OWNER, "--reason", " ")
    assert bad.returncode == 2 and "reason" in bad.stderr


def test_an_answer_of_a_suspended_owner_is_refused(settings: Settings) -> None:
    clock = Clock(T0)
    human = workflow(step_spec("a", with_={"states": [["input_required"]], "prompt": "ok?"}))
    run_id = launch(settings, human, now=clock.now, owner=OWNER)
    drive(Stepper(settings, Executor(settings, None), clock=clock, worker="unit", pid=1), run_id)
    assert run_row(settings, run_id).park_reason == "human"
    orch = Orchestrator(settings, RecordingDispatcher(), clock=clock)
    _suspend(orch)
    with pytest.raises(OwnerSuspended):
        orch.answer(run_id, "a", "yes", owner=OWNER)
    assert run_row(settings, run_id).status == "parked"


def test_the_dashboard_shows_the_owner_a_banner_and_the_operator_every_suspended_owner(
    orch: Orchestrator, settings: Settings
) -> None:
    app = create_app(orch)
    owner = TestClient(app, headers={"Authorization": f"Bearer {_token(settings, OWNER)}"})
    operator_token = _token(settings, None, operator=True)
    operator = TestClient(app, headers={"Authorization": f"Bearer {operator_token}"})
    assert 'id="suspended-banner"' not in owner.get("/dashboard").text
    assert 'id="suspended-owners"' not in operator.get("/dashboard").text
    _suspend(orch, reason="abuse <b>42</b>")
    page = owner.get("/dashboard")
    assert page.status_code == 200
    assert 'id="suspended-banner"' in page.text
    assert "abuse &lt;b&gt;42&lt;/b&gt;" in page.text
    listed = operator.get("/dashboard").text
    assert 'data-owner="acme"' in listed and "operator alice" in listed
    _resume(orch)
    assert 'id="suspended-banner"' not in owner.get("/dashboard").text
