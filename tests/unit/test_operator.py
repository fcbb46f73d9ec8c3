"""The operator role (issue 14, one part): an operator's token reads every owner's runs and
cancels any of them under ``/operator``, journalled with the token's name; an owner's token
gets 403 on every operator route, and an operator's token 403 on every owner route."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import ValidationError
from orchestration.core.settings import Settings
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from tests.unit.support import RecordingDispatcher, step_spec, workflow


@pytest.fixture
def orch(settings: Settings) -> Orchestrator:
    return Orchestrator(settings, RecordingDispatcher())


def _token(settings: Settings, owner: str | None, name: str, *, operator: bool = False) -> str:
    with session_scope(settings.database_url) as session:
        return tokens.create(session, owner, name, now=utcnow(), operator=operator)


def _client(orch: Orchestrator, token: str) -> TestClient:
    return TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"})


def test_an_operator_reads_every_owners_runs_and_cancels_one_journalled_by_name(
    orch: Orchestrator, settings: Settings
) -> None:
    first = orch.launch(workflow(step_spec("a")), owner="acme")
    second = orch.launch(workflow(step_spec("a")), owner="globex")
    client = _client(orch, _token(settings, None, "alice", operator=True))
    page = client.get("/operator/runs").json()
    assert {(run["id"], run["owner"]) for run in page["runs"]} == {
        (first.id, "acme"),
        (second.id, "globex"),
    }
    only = client.get("/operator/runs", params={"owner": "globex"}).json()["runs"]
    assert [run["id"] for run in only] == [second.id]
    assert client.get(f"/operator/runs/{first.id}").json()["owner"] == "acme"
    cancelled = client.post(f"/operator/runs/{second.id}/cancel")
    assert (cancelled.status_code, cancelled.json()["status"]) == (200, "cancelled")
    causes = [event["cause"] for event in client.get(f"/operator/runs/{second.id}/events").json()]
    assert "cancel requested by operator alice" in causes
    # The owner reads the same journal, and sees who stopped the run.
    assert "cancel requested by operator alice" in [
        event["cause"] for event in orch.events(second.id, owner="globex")
    ]
    assert client.get("/operator/runs/nope").status_code == 404


def _calls(orch: Orchestrator, prefix: str) -> list[tuple[str, str]]:
    """``(method, path)`` of every route under ``prefix`` in the API's schema, placeholders
    filled in."""
    paths = create_app(orch).openapi()["paths"]
    return [
        (method.upper(), re.sub(r"\{[^}]+\}", "x", path))
        for path, methods in paths.items()
        if path.startswith(prefix)
        for method in methods
    ]


def test_an_owner_token_is_forbidden_on_every_operator_route(
    orch: Orchestrator, settings: Settings
) -> None:
    client = _client(orch, _token(settings, "acme", "ci"))
    calls = _calls(orch, "/operator")
    # runs, a run, its events, cancel, deletions; the suspended owners, an owner's
    # suspension, suspend, resume
    assert len(calls) == 9
    for method, path in calls:
        reply = client.request(method, path)
        assert reply.status_code == 403, (method, path)
        assert reply.json()["error"]["code"] == "forbidden"


def test_an_operator_token_acts_as_no_owner_on_any_owner_route(
    orch: Orchestrator, settings: Settings
) -> None:
    orch.launch(workflow(step_spec("a")), owner="acme")
    client = _client(orch, _token(settings, None, "alice", operator=True))
    calls = _calls(orch, "/runs") + _calls(orch, "/workflows") + _calls(orch, "/schedules")
    assert len(calls) >= 15
    assert ("POST", "/schedules/x/pause") in calls
    for method, path in calls:
        assert client.request(method, path).status_code == 403, (method, path)


def test_an_operator_token_needs_a_name_and_no_owner(settings: Settings) -> None:
    with pytest.raises(ValidationError, match="needs a name"):
        _token(settings, None, "", operator=True)
    with pytest.raises(ValidationError, match="acts as no owner"):
        _token(settings, "acme", "alice", operator=True)
    with session_scope(settings.database_url) as session:
        assert tokens.owner_for(session, _token(settings, None, "bob", operator=True)) is None
