"""Stopping an owner through the Python API and ``/operator/owners`` (issue 30): the same
calls as ``orchestration owners suspend|resume|suspended``, an operator token's name in the
audit and in the journal of every run its ``cancel_live`` ended; an owner's token is refused,
and bad input writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import OwnerSuspended, ValidationError
from orchestration.core.followups import Done
from orchestration.core.models import OwnerEvent, OwnerSuspension
from orchestration.core.settings import Settings
from orchestration.execution import Poll, Stepper
from orchestration.runs.owner_cancels import Suspended
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from tests.unit.support import RecordingDispatcher, counts, run_row, step_spec, steps_of, workflow

OWNER = "acme"


@pytest.fixture
def dispatcher() -> RecordingDispatcher:
    return RecordingDispatcher()


@pytest.fixture
def orch(settings: Settings, dispatcher: RecordingDispatcher) -> Orchestrator:
    return Orchestrator(settings, dispatcher)


def _client(orch: Orchestrator, owner: str | None, name: str = "ci") -> TestClient:
    with session_scope(orch.settings.database_url) as session:
        token = tokens.create(session, owner, name, now=utcnow(), operator=owner is None)
    return TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"})


def _written(orch: Orchestrator) -> tuple[int, int]:
    """Rows of ``owner_suspensions`` and of the owner audit."""

    def read(session: Any) -> Done[tuple[int, int]]:
        return Done(
            (
                int(session.scalar(select(func.count()).select_from(OwnerSuspension)) or 0),
                int(session.scalar(select(func.count()).select_from(OwnerEvent)) or 0),
            )
        )

    return orch.transact(read)


def _running(orch: Orchestrator, owner: str) -> str:
    """A run of ``owner`` whose step has a provider turn running."""
    run_id = orch.launch(
        workflow(step_spec("a", with_={"states": [["running", 600]]})), owner=owner
    )
    stepper = Stepper(orch.settings, Executor(orch.settings, None), clock=utcnow)
    assert isinstance(stepper.advance(run_id.id, 0, 0), Poll)
    assert run_row(orch.settings, run_id.id).status == "running"
    return run_id.id


def test_an_operator_suspends_over_http_the_owner_is_refused_and_the_audit_names_the_token(
    orch: Orchestrator,
) -> None:
    owner = _client(orch, OWNER)
    operator = _client(orch, None, "alice")
    reply = operator.post(f"/operator/owners/{OWNER}/suspend", json={"reason": "abuse report 42"})
    assert reply.status_code == 201, reply.text
    made = reply.json()
    assert (made["owner"], made["reason"], made["by"]) == (
        OWNER,
        "abuse report 42",
        "operator alice",
    )
    assert (made["new"], made["cancelled"]) == (True, None)
    for refused in (owner.get("/runs"), owner.post("/runs", json={"workflow": workflow()})):
        error = refused.json()["error"]
        assert (refused.status_code, error["code"]) == (403, "owner_suspended")
        assert "abuse report 42" in error["message"]
    with pytest.raises(OwnerSuspended):
        orch.launch(workflow(), owner=OWNER)
    # Idempotent: the first suspension is kept, 200.
    again = operator.post(f"/operator/owners/{OWNER}/suspend", json={"reason": "other"})
    assert again.status_code == 200
    assert {**again.json(), "new": True} == made
    listed = operator.get("/operator/owners/suspended")
    assert [(one["owner"], one["by"]) for one in listed.json()] == [(OWNER, "operator alice")]

    resumed = operator.post(f"/operator/owners/{OWNER}/resume")
    assert resumed.status_code == 200
    assert resumed.json()["resumed"] is True
    assert resumed.json()["lifted"]["since"] == made["since"]
    assert owner.get("/runs").status_code == 200
    assert owner.post("/runs", json={"workflow": workflow()}).status_code == 201
    # Resuming an owner that is not suspended changes nothing, and says so.
    assert operator.post(f"/operator/owners/{OWNER}/resume").json() == {
        "owner": OWNER,
        "resumed": False,
        "lifted": None,
    }
    assert operator.get("/operator/owners/suspended").json() == []
    state = operator.get(f"/operator/owners/{OWNER}/suspension").json()
    assert state["suspension"] is None
    assert [(event["kind"], event["by"]) for event in state["events"]] == [
        ("resumed", "operator alice"),
        ("suspended", "operator alice"),
    ]


def test_cancel_live_over_http_ends_the_owners_live_runs_through_the_cancel_path(
    orch: Orchestrator, settings: Settings, dispatcher: RecordingDispatcher
) -> None:
    queued = [orch.launch(workflow(), owner=OWNER).id for _ in range(2)]
    running = _running(orch, OWNER)
    other = orch.launch(workflow(), owner="globex").id
    operator = _client(orch, None, "alice")
    reply = operator.post(
        f"/operator/owners/{OWNER}/suspend", json={"reason": "abuse", "cancel_live": True}
    )
    assert reply.status_code == 201, reply.text
    assert reply.json()["cancelled"] == 3
    for run_id in [*queued, running]:
        row = run_row(settings, run_id)
        assert (row.status, row.stop_reason) == ("cancelled", "cancel_requested")
        assert (row.cause or "").startswith(
            f"owner suspended: owner '{OWNER}' suspended by operator alice (abuse)"
        )
        assert steps_of(settings, run_id)[0].status == "cancelled"
    # The running turn's tasks were revoked and its provider turn stopped.
    assert dispatcher.revoked
    stop = steps_of(settings, running)[0].turn_stop
    assert stop is not None and stop["status"] == "stopped"
    assert run_row(settings, other).status == "queued"
    events = operator.get(f"/operator/owners/{OWNER}/suspension").json()["events"]
    assert [(e["kind"], e["by"], e["detail"]) for e in events] == [
        ("cancelled_live", "operator alice", {"cancelled": 3}),
        ("suspended", "operator alice", None),
    ]


def test_cancel_live_on_an_owner_already_suspended_keeps_the_suspension_and_names_who_asked(
    orch: Orchestrator, settings: Settings
) -> None:
    live = orch.launch(workflow(), owner=OWNER).id
    orch.suspend_owner(OWNER, reason="abuse", by="operator alice")
    assert run_row(settings, live).status == "queued"
    reply = _client(orch, None, "bob").post(
        f"/operator/owners/{OWNER}/suspend", json={"reason": "again", "cancel_live": True}
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert (body["new"], body["by"], body["reason"], body["cancelled"]) == (
        False,
        "operator alice",
        "abuse",
        1,
    )
    assert run_row(settings, live).status == "cancelled"
    causes = [event["cause"] for event in orch.events(live, owner=OWNER)]
    assert "cancel requested by operator bob (owner 'acme' suspended)" in causes
    assert [(e["kind"], e["by"]) for e in orch.owner_events(OWNER)] == [
        ("cancelled_live", "operator bob"),
        ("suspended", "operator alice"),
    ]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (f"/operator/owners/{OWNER}/suspend", {"reason": "  "}, "reason"),
        (f"/operator/owners/{OWNER}/suspend", {"reason": "x" * 501}, "reason"),
        (f"/operator/owners/{OWNER}/suspend", {"cancel_live": True}, "reason"),
        (f"/operator/owners/{OWNER}/suspend", {"reason": 42}, "reason"),
        (f"/operator/owners/{OWNER}/suspend", {"reason": "ok", "by": "me"}, "by"),
        (f"/operator/owners/{'o' * 201}/suspend", {"reason": "ok"}, "owner"),
    ],
    ids=["blank reason", "long reason", "no reason", "reason not text", "unknown field", "owner"],
)
def test_bad_input_is_a_400_naming_the_field_and_writes_or_cancels_nothing(
    orch: Orchestrator, settings: Settings, path: str, body: dict[str, Any], field: str
) -> None:
    live = orch.launch(workflow(), owner=OWNER).id
    before = counts(settings)
    reply = _client(orch, None, "alice").post(path, json={**body, "cancel_live": True})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["field"]) == ("validation_error", field)
    assert (_written(orch), counts(settings)) == ((0, 0), before)
    assert run_row(settings, live).status == "queued"


def test_an_owner_token_is_forbidden_and_suspends_nothing(orch: Orchestrator) -> None:
    owner = _client(orch, OWNER)
    for reply in (
        owner.post("/operator/owners/globex/suspend", json={"reason": "x", "cancel_live": True}),
        owner.post("/operator/owners/globex/resume"),
        owner.get("/operator/owners/suspended"),
        owner.get("/operator/owners/globex/suspension"),
    ):
        assert (reply.status_code, reply.json()["error"]["code"]) == (403, "forbidden")
    assert _written(orch) == (0, 0)
    anonymous = TestClient(create_app(orch))
    assert anonymous.post("/operator/owners/globex/resume").status_code == 401


def test_the_python_api_suspends_cancels_live_reads_and_resumes(
    orch: Orchestrator, settings: Settings
) -> None:
    runs = [orch.launch(workflow(), owner=OWNER).id for _ in range(3)]
    seen: list[Suspended] = []
    done = orch.suspend_owner(
        OWNER,
        reason="abuse  report\n42",
        by="ops bot",
        cancel_live=True,
        batch=2,
        progress=seen.append,
    )
    assert (done.new, done.cancelled, done.suspension.reason) == (True, 3, "abuse report 42")
    assert [(one.new, one.cancelled) for one in seen] == [(True, None), (True, 2), (True, 3)]
    assert all(run_row(settings, run_id).status == "cancelled" for run_id in runs)
    with pytest.raises(OwnerSuspended, match="abuse report 42"):
        orch.launch(workflow(), owner=OWNER)
    again = orch.suspend_owner(OWNER, reason="other", by="someone else")
    assert again == Suspended(done.suspension, False, None)
    assert orch.suspended_owners() == [done.suspension]
    assert orch.owner_suspension(OWNER) == done.suspension
    assert orch.owner_suspension("globex") is None

    assert orch.resume_owner(OWNER, by="ops bot") == done.suspension
    assert orch.resume_owner(OWNER, by="ops bot") is None
    assert orch.launch(workflow(), owner=OWNER).status == "queued"
    assert [(e["kind"], e["by"], e["detail"]) for e in orch.owner_events(OWNER)] == [
        ("resumed", "ops bot", None),
        ("cancelled_live", "ops bot", {"cancelled": 3}),
        ("suspended", "ops bot", None),
    ]
    assert len(orch.owner_events(OWNER, last=1)) == 1


def test_the_python_api_refuses_a_bad_reason_naming_it_and_writes_nothing(
    orch: Orchestrator, settings: Settings
) -> None:
    live = orch.launch(workflow(), owner=OWNER).id
    for reason in ("", " \t", "x" * 501):
        with pytest.raises(ValidationError) as refused:
            orch.suspend_owner(OWNER, reason=reason, by="ops", cancel_live=True)
        assert refused.value.field == "reason"
    with pytest.raises(ValidationError) as refused:
        orch.suspend_owner("", reason="ok", by="ops")
    assert refused.value.field == "owner"
    assert _written(orch) == (0, 0)
    assert run_row(settings, live).status == "queued"
