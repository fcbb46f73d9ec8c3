"""Launching from the dashboard (issue 14): choose a registered version, fill the form its
``args_schema`` builds, launch with the request id the form carries; errors at the field."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient

from orchestration.core.db import session_scope, utcnow
from orchestration.core.settings import Settings
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.surfaces.api.auth import csrf_value
from orchestration.surfaces.api.launch_fields import field_of, fields_of
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
        "csrf": csrf_value(token),
        "workflow": "research@1",
        "request_id": request_id.group(1),
        "arg.topic": "otters",
        "arg.depth": "3",
        "arg.tone": "warm",
    }
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


def _every_kind() -> dict[str, Any]:
    return {
        "name": "kinds",
        "args_schema": {
            "type": "object",
            "required": ["topic", "flag", "tone"],
            "properties": {
                "topic": {"type": "string", "minLength": 2, "maxLength": 40, "description": "what"},
                "depth": {"type": "integer", "minimum": 1, "maximum": 5},
                "ratio": {"type": "number", "minimum": 0.5},
                "tone": {"enum": ["dry", "warm"]},
                "level": {"enum": [1, 2, 3], "default": 2},
                "flag": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "limits": {"type": "object", "default": {"max": 3}},
                "retries": {"type": ["integer", "null"], "maximum": 9},
            },
        },
        "steps": [step_spec("a", task="About {{ args.topic }}")],
    }


def _control(page: str, name: str) -> str:
    """The opening tag of the control of field ``name``."""
    found = re.search(rf'<(input|select|textarea) [^>]*name="arg\.{name}"[^>]*>', page)
    assert found is not None, name
    return found.group(0)


def test_each_field_carries_its_type_bounds_and_requirement_from_the_schema(
    settings: Settings,
) -> None:
    orch = Orchestrator(settings, RecordingDispatcher())
    orch.register_workflow(_every_kind(), owner=OWNER)
    client, _ = _client(settings, orch)
    page = client.get("/dashboard/launch", params={"workflow": "kinds"}).text
    topic = _control(page, "topic")
    assert 'type="text"' in topic and " required" in topic
    assert 'minlength="2"' in topic and 'maxlength="40"' in topic
    assert 'aria-describedby="hint-topic"' in topic
    assert '<p class="hint muted" id="hint-topic">what · 2 to 40 characters</p>' in page
    depth = _control(page, "depth")
    assert 'type="number"' in depth and 'step="1"' in depth and " required" not in depth
    assert 'min="1"' in depth and 'max="5"' in depth
    assert "a whole number 1 to 5" in page
    assert 'step="any"' in _control(page, "ratio") and 'min="0.5"' in _control(page, "ratio")
    for name, options in (
        ("tone", ["", "dry", "warm"]),
        ("level", ["", "1", "2", "3"]),
        ("flag", ["", "true", "false"]),
    ):
        assert _control(page, name).startswith("<select"), name
        select = page.split(_control(page, name), 1)[1].split("</select>", 1)[0]
        assert re.findall(r'<option value="([^"]*)"', select) == options, name
    assert " required" in _control(page, "tone") and " required" in _control(page, "flag")
    assert '<option value="2" selected>2</option>' in page  # the default, as the enum's text
    assert (
        _control(page, "tags").startswith("<textarea") and "JSON (array) at least 1 items" in page
    )
    assert "{&#34;max&#34;: 3}</textarea>" in page  # a default object, as JSON
    assert 'type="number"' in _control(page, "retries")  # [integer, null]: an integer field


def test_every_wrong_field_is_shown_at_once_and_nothing_is_launched(settings: Settings) -> None:
    orch = Orchestrator(settings, RecordingDispatcher())
    orch.register_workflow(_every_kind(), owner=OWNER)
    client, token = _client(settings, orch)
    base = {"csrf": csrf_value(token), "workflow": "kinds@1", "request_id": "r1"}
    sent = {
        "arg.topic": "x",
        "arg.depth": "9",
        "arg.ratio": "0.1",
        "arg.tone": "loud",
        "arg.tags": "[1]",
        "arg.limits": "{nope",
        "arg.retries": "",
    }
    reply = client.post("/dashboard/launch", data={**base, **sent})
    assert reply.status_code == 400
    shown = dict(
        re.findall(r'<p class="error field-error" id="error-(\w+)">([^<]+)</p>', reply.text)
    )
    assert shown == {
        "topic": "args.topic: must have at least 2 characters",
        "depth": "args.depth: must be at most 5",
        "ratio": "args.ratio: must be at least 0.5",
        "tone": "args.tone: is not one of the listed values",
        "flag": "args.flag: is required",
        "tags": "args.tags[0]: must be string, not integer",
        "limits": "args.limits: &#39;{nope&#39; is not JSON",
    }
    assert 'aria-describedby="hint-depth error-depth" aria-invalid="true"' in _control(
        reply.text, "depth"
    )
    assert 'value="x"' in _control(reply.text, "topic")  # what was typed stays
    assert orch.list(owner=OWNER) == []
    fixed = {**sent, "arg.topic": "otters", "arg.depth": "3", "arg.ratio": "0.75"}
    fixed |= {"arg.tone": "dry", "arg.flag": "false", "arg.tags": '["a"]', "arg.limits": "{}"}
    done = client.post(
        "/dashboard/launch", data={**base, **fixed, "arg.level": "3"}, follow_redirects=False
    )
    assert done.status_code == 303, done.text
    run = orch.get(done.headers["location"].rsplit("/", 1)[1], owner=OWNER)
    assert run.args == {
        "topic": "otters",
        "depth": 3,
        "ratio": 0.75,
        "tone": "dry",
        "level": 3,
        "flag": False,
        "tags": ["a"],
        "limits": {},
    }


def test_an_error_of_the_whole_launch_goes_to_the_field_it_names(settings: Settings) -> None:
    fields = fields_of(_every_kind()["args_schema"] | {"properties": {"a": {}, "ab": {}}})
    assert [field_of(path, fields) for path in ("args.ab", "args.a[2]", "args.a.x")] == [
        "ab",
        "a",
        "a",
    ]
    assert [field_of(path, fields) for path in ("args", "steps[0].task", "args.abc")] == [None] * 3
    orch = Orchestrator(settings, RecordingDispatcher())
    orch.register_workflow(
        {"name": "bare", "steps": [step_spec("a", task="{{ args.topic }}")]}, owner=OWNER
    )
    client, token = _client(settings, orch)
    base = {"csrf": csrf_value(token), "workflow": "bare@1", "request_id": "r2"}
    not_json = client.post("/dashboard/launch", data={**base, "args": "[1"})
    assert '<p class="error field-error" id="error-args">args: is not JSON' in not_json.text
    missing = client.post("/dashboard/launch", data={**base, "args": "{}"})
    assert missing.status_code == 400
    assert re.search(r'<p class="error" id="launch-error" role="alert">[^<]*topic', missing.text)


def test_a_bare_name_chooses_its_latest_version(settings: Settings) -> None:
    orch = Orchestrator(settings, RecordingDispatcher())
    orch.register_workflow(_research("Research {{ args.topic }}"), owner=OWNER)
    orch.register_workflow(_research("Dig into {{ args.topic }}"), owner=OWNER)
    orch.register_workflow(_every_kind(), owner=OWNER)
    client, _ = _client(settings, orch)
    page = client.get("/dashboard/launch", params={"workflow": "research"}).text
    assert '<strong class="mono" id="chosen">research@2</strong>' in page
