"""Launching from the dashboard (issue 14): choose a registered version, fill the form its
``args_schema`` builds, launch with the request id the form carries; errors at the field."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient

from orchestration.db import session_scope, utcnow
from orchestration.service import Orchestrator
from orchestration.settings import Settings
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.surfaces.api.auth import csrf_value
from tests.unit.support import RecordingDispatcher, step_spec

OWNER = "owner-1"


def _research(task: str) -> dict[str, Any]:
    return {
        "name": "research",
        "args_schema": {
            "type": "object",
            "required": ["topic"],
            "properties": {
                "topic": {"type": "string", "minLength": 2, "description": "what to research"},
                "depth": {"type": "integer", "maximum": 5},
                "tone": {"enum": ["dry", "warm"]},
            },
        },
        "steps": [step_spec("a", task=task)],
    }


def _client(
    settings: Settings, orch: Orchestrator, *, operator: bool = False
) -> tuple[TestClient, str]:
    with session_scope(settings.database_url) as session:
        token = tokens.create(
            session, None if operator else OWNER, "t", now=utcnow(), operator=operator
        )
    return TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"}), token


def test_the_form_launches_the_chosen_version_with_typed_args_once(settings: Settings) -> None:
    orch = Orchestrator(settings, RecordingDispatcher())
    orch.register_workflow(_research("Research {{ args.topic }}"), owner=OWNER)
    orch.register_workflow(_research("Dig into {{ args.topic }}"), owner=OWNER)
    client, token = _client(settings, orch)
    page = client.get("/dashboard/launch", params={"workflow": "research@1"})
    assert page.status_code == 200
    assert re.findall(r'name="(arg\.\w+)"', page.text) == ["arg.topic", "arg.depth", "arg.tone"]
    request_id = re.search(r'name="request_id" value="([^"]+)"', page.text)
    assert request_id is not None
    form = {
        "csrf": csrf_value(token), "workflow": "research@1", "request_id": request_id.group(1),
        "arg.topic": "otters", "arg.depth": "3", "arg.tone": "warm",
    }  # fmt: skip
    sent = client.post("/dashboard/launch", data=form, follow_redirects=False)
    assert sent.status_code == 303
    run_id = sent.headers["location"].rsplit("/", 1)[1]
    run = orch.get(run_id, owner=OWNER)
    assert (run.workflow_version, run.args) == (1, {"topic": "otters", "depth": 3, "tone": "warm"})
    again = client.post("/dashboard/launch", data=form, follow_redirects=False)
    assert again.headers["location"] == sent.headers["location"]  # a double submit: one run
    newer = {**form, "workflow": "research@2", "request_id": "other"}
    later = client.post("/dashboard/launch", data=newer, follow_redirects=False)
    assert orch.get(later.headers["location"].rsplit("/", 1)[1], owner=OWNER).workflow_version == 2


def test_an_error_is_shown_at_its_field_and_nothing_is_launched(settings: Settings) -> None:
    orch = Orchestrator(settings, RecordingDispatcher())
    orch.register_workflow(_research("Research {{ args.topic }}"), owner=OWNER)
    client, token = _client(settings, orch)
    base = {"csrf": csrf_value(token), "workflow": "research@1", "request_id": "r1"}
    for given, field, message in (
        ({"arg.topic": "x"}, "topic", "at least 2"),
        ({"arg.topic": "otters", "arg.depth": "9"}, "depth", "at most 5"),
        ({"arg.topic": "otters", "arg.depth": "many"}, "depth", "not a whole number"),
        ({}, "topic", "is required"),
    ):
        reply = client.post("/dashboard/launch", data={**base, **given})
        assert reply.status_code == 400
        shown = re.search(
            rf'<p class="error field-error" id="error-{field}">([^<]+)</p>', reply.text
        )
        assert shown is not None and message in shown.group(1), reply.text
    assert orch.list(owner=OWNER) == []
    stale = client.post("/dashboard/launch", data={**base, "csrf": "x", "arg.topic": "otters"})
    assert stale.status_code == 403
    operator, _ = _client(settings, orch, operator=True)
    assert operator.get("/dashboard/launch").status_code == 403
