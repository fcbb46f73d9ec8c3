"""Schedules on the Python API, over HTTP and in the CLI: the listing, pause and resume by
name, each owner's own only (another owner's schedule is refused like a missing one)."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from orchestration.core.db import session_scope
from orchestration.core.errors import ValidationError
from orchestration.core.settings import Settings
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.surfaces.api.auth import csrf_value
from tests.unit.support import RecordingDispatcher, cli
from tests.unit.test_schedules import OWNER, T0, _pass, _register, _workflow

NOW = T0 + timedelta(seconds=12)


@pytest.fixture
def orch(settings: Settings) -> Orchestrator:
    """An orchestrator whose clock stands 12 s after the schedule's registration."""
    return Orchestrator(settings, RecordingDispatcher(), clock=lambda: NOW)


def _client(orch: Orchestrator, owner: str) -> TestClient:
    with session_scope(orch.settings.database_url) as session:
        token = tokens.create(session, owner, "t", now=T0)
    return TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"})


def test_the_python_api_lists_pauses_and_resumes_the_owners_schedules(
    orch: Orchestrator,
) -> None:
    _register(orch, _workflow(overlap="enqueue"))
    _pass(orch, T0 + timedelta(seconds=10))
    (shown,) = orch.schedules(owner=OWNER)
    assert (shown["ref"], shown["paused"], shown["paused_at"]) == ("nightly@1", False, None)
    assert shown["next_fires"][0] == (T0 + timedelta(seconds=20)).isoformat()
    assert [fire["status"] for fire in shown["last_fires"]] == ["launched"]
    assert orch.pause_schedule("nightly", owner=OWNER) is True
    assert orch.pause_schedule("nightly", owner=OWNER) is False
    (paused,) = orch.schedules(owner=OWNER)
    assert (paused["paused"], paused["paused_at"]) == (True, NOW.isoformat())
    assert orch.resume_schedule("nightly", owner=OWNER) is True
    assert orch.resume_schedule("nightly", owner=OWNER) is False
    assert orch.schedules(owner="owner-2") == []
    for call in (orch.pause_schedule, orch.resume_schedule):
        with pytest.raises(ValidationError) as refused:
            call("nightly", owner="owner-2")
        assert refused.value.field == "name"


def test_the_http_api_lists_pauses_and_resumes_them(orch: Orchestrator) -> None:
    _register(orch, _workflow(overlap="enqueue"))
    _pass(orch, T0 + timedelta(seconds=10))
    client = _client(orch, OWNER)
    listed = client.get("/schedules")
    assert (listed.status_code, listed.json()) == (200, orch.schedules(owner=OWNER))
    (shown,) = listed.json()
    assert shown["last_fires"][0]["fire_at"] == (T0 + timedelta(seconds=10)).isoformat()
    for path, state in [
        ("pause", {"paused": True, "changed": True}),
        ("pause", {"paused": True, "changed": False}),
        ("resume", {"paused": False, "changed": True}),
        ("resume", {"paused": False, "changed": False}),
    ]:
        reply = client.post(f"/schedules/nightly/{path}")
        assert (reply.status_code, reply.json()) == (200, {"name": "nightly", **state}), path
    unknown = client.post("/schedules/weekly/pause")
    assert unknown.status_code == 400
    assert (unknown.json()["error"]["code"], unknown.json()["error"]["field"]) == (
        "validation_error",
        "name",
    )


def test_another_owner_sees_none_of_them_and_cannot_pause_one(orch: Orchestrator) -> None:
    _register(orch, _workflow(overlap="enqueue"))
    theirs = _client(orch, "owner-2")
    assert theirs.get("/schedules").json() == []
    for path in ("pause", "resume"):
        refused = theirs.post(f"/schedules/nightly/{path}")
        assert (refused.status_code, refused.json()["error"]["field"]) == (400, "name")
    assert "owner-1" not in refused.json()["error"]["message"]  # nothing leaks of its owner
    assert orch.schedules(owner=OWNER)[0]["paused"] is False


def test_the_cli_lists_pauses_and_resumes_through_the_same_calls(settings: Settings) -> None:
    _register(Orchestrator(settings, None), _workflow())
    schedules = cli(settings, OWNER)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return schedules("schedules", *argv)

    assert "paused nightly" in run("pause", "nightly").stdout
    assert "nightly was already paused" in run("pause", "nightly").stdout
    (shown,) = json.loads(run("list", "--json").stdout)
    assert (shown["ref"], shown["paused"]) == ("nightly@1", True)
    assert "resumed nightly" in run("resume", "nightly").stdout
    refused = run("pause", "weekly")
    assert refused.returncode == 2 and "no registered workflow 'weekly'" in refused.stderr


def test_the_dashboard_buttons_pause_and_resume_with_the_forms_csrf_value(
    orch: Orchestrator,
) -> None:
    _register(orch, _workflow())
    client = _client(orch, OWNER)
    page = client.get("/dashboard/schedules").text
    action = re.search(r'<form method="post" action="(/dashboard/schedules/[^"]+)">', page)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert action is not None and csrf is not None
    assert action.group(1) == "/dashboard/schedules/nightly/pause" and ">Pause nightly<" in page
    stale = client.post(action.group(1), data={"csrf": "forged"}, follow_redirects=False)
    assert stale.status_code == 403 and orch.schedules(owner=OWNER)[0]["paused"] is False
    done = client.post(action.group(1), data={"csrf": csrf.group(1)}, follow_redirects=False)
    assert (done.status_code, done.headers["location"]) == (303, "/dashboard/schedules")
    assert orch.schedules(owner=OWNER)[0]["paused"] is True
    assert ">Resume nightly<" in client.get("/dashboard/schedules").text
    # Another owner's form (404: no such schedule of theirs), an operator's (403): unchanged.
    for owner, status in (("owner-2", 404), (None, 403)):
        with session_scope(orch.settings.database_url) as session:
            token = tokens.create(session, owner, "t", now=T0, operator=owner is None)
        posted = TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"}).post(
            "/dashboard/schedules/nightly/resume",
            data={"csrf": csrf_value(token)},
            follow_redirects=False,
        )
        assert posted.status_code == status and orch.schedules(owner=OWNER)[0]["paused"] is True
    client.post("/dashboard/schedules/nightly/resume", data={"csrf": csrf.group(1)})
    assert orch.schedules(owner=OWNER)[0]["paused"] is False
