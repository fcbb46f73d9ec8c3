"""Registered workflow definitions (issue 14, first part): ``name@version`` per owner with a
content hash, launched by name through the Python API, the HTTP API and the CLI, with an
``args_schema`` checked at launch before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import ValidationError
from orchestration.core.models import Run
from orchestration.core.settings import Settings
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.workflows import args_schema
from tests.unit.support import RecordingDispatcher, cli, step_spec

OWNER = "owner-1"
SCHEMA = {
    "type": "object",
    "required": ["topic"],
    "properties": {"topic": {"type": "string", "minLength": 2}, "depth": {"type": "integer"}},
    "additionalProperties": False,
}


def _research(task: str = "Research {{ args.topic }}") -> dict[str, Any]:
    return {"name": "research", "args_schema": SCHEMA, "steps": [step_spec("a", task=task)]}


@pytest.fixture
def orch(settings: Settings) -> Orchestrator:
    return Orchestrator(settings, RecordingDispatcher())


def _runs(settings: Settings) -> int:
    with session_scope(settings.database_url) as session:
        return int(session.scalar(select(func.count()).select_from(Run)) or 0)


def test_the_same_content_is_one_version_and_a_change_is_the_next(orch: Orchestrator) -> None:
    first, created = orch.register_workflow(_research(), owner=OWNER)
    assert (first.ref, created) == ("research@1", True)
    reordered = {"steps": _research()["steps"], "args_schema": SCHEMA, "name": "research"}
    again, created = orch.register_workflow(reordered, owner=OWNER)
    assert (again.ref, again.sha256, created) == ("research@1", first.sha256, False)
    second, created = orch.register_workflow(_research("Dig into {{ args.topic }}"), owner=OWNER)
    assert (second.ref, created) == ("research@2", True)
    assert second.sha256 != first.sha256
    back, created = orch.register_workflow(_research(), owner=OWNER)  # an older content
    assert (back.ref, created) == ("research@1", False)
    assert [one.ref for one in orch.workflows(owner=OWNER)] == ["research@2", "research@1"]
    assert orch.workflow("research", owner=OWNER).version == 2


def test_a_launch_by_name_runs_the_exact_stored_version(
    orch: Orchestrator, settings: Settings
) -> None:
    orch.register_workflow(_research(), owner=OWNER)
    orch.register_workflow(_research("Dig into {{ args.topic }}"), owner=OWNER)
    old = orch.launch("research@1", {"topic": "otters"}, owner=OWNER)
    new = orch.launch("research", {"topic": "otters"}, owner=OWNER)
    assert (old.workflow_name, old.workflow_version) == ("research", 1)
    assert (new.workflow_name, new.workflow_version) == ("research", 2)
    assert old.workflow == orch.workflow("research@1", owner=OWNER).definition
    assert new.workflow["steps"][0]["task"] == "Dig into {{ args.topic }}"
    inline = orch.launch(_research(), {"topic": "otters"}, owner=OWNER)
    assert inline.workflow_version is None  # an inline file stays possible


def test_args_are_checked_against_the_schema_naming_the_field_and_nothing_is_written(
    orch: Orchestrator, settings: Settings
) -> None:
    orch.register_workflow(_research(), owner=OWNER)
    cases = [
        ({}, "args.topic", "is required"),
        ({"topic": 3}, "args.topic", "must be string"),
        ({"topic": "x"}, "args.topic", "at least 2"),
        ({"topic": "ok", "colour": "red"}, "args.colour", "not a known argument"),
        ({"topic": "ok", "depth": 1.5}, "args.depth", "must be integer"),
    ]
    for args, field, message in cases:
        with pytest.raises(ValidationError, match=message) as caught:
            orch.launch("research", args, owner=OWNER)
        assert caught.value.field == field
    assert _runs(settings) == 0


def test_a_schema_outside_the_subset_is_refused_where_it_is_wrong(orch: Orchestrator) -> None:
    bad = {**_research(), "args_schema": {"type": "object", "properties": {"t": {"minLenght": 1}}}}
    with pytest.raises(ValidationError, match="unknown keyword 'minLenght'") as caught:
        orch.register_workflow(bad, owner=OWNER)
    assert caught.value.field == "args_schema.properties.t"
    for schema, field in (
        ({"type": "text"}, "args_schema.type"),
        ({"required": "topic"}, "args_schema.required"),
        ({"maxLength": -1}, "args_schema.maxLength"),
        ({"pattern": ".*"}, "args_schema"),
    ):
        with pytest.raises(ValidationError) as caught:
            args_schema.check_schema(schema)
        assert caught.value.field == field
    with pytest.raises(ValidationError, match="name"):
        orch.register_workflow({**_research(), "name": "re search"}, owner=OWNER)


def test_definitions_are_per_owner_and_a_published_one_is_everyones(orch: Orchestrator) -> None:
    orch.register_workflow(_research(), owner=OWNER)
    with pytest.raises(ValidationError, match="no workflow 'research'") as caught:
        orch.launch("research", {"topic": "otters"}, owner="owner-2")
    assert caught.value.field == "workflow"
    assert orch.workflows(owner="owner-2") == []
    shared, _ = orch.register_workflow(
        {"name": "triage", "steps": [step_spec("a")]}, owner="ops", shared=True
    )
    assert shared.shared
    run = orch.launch("triage@1", owner="owner-2")
    assert (run.owner, run.workflow_version) == ("owner-2", 1)
    assert [one.ref for one in orch.workflows(owner=OWNER)] == ["research@1", "triage@1"]


def test_the_http_api_registers_lists_shows_and_launches_by_name(
    orch: Orchestrator, settings: Settings
) -> None:
    with session_scope(settings.database_url) as session:
        mine = tokens.create(session, OWNER, "t", now=utcnow())
        theirs = tokens.create(session, "owner-2", "t", now=utcnow())
    client = TestClient(create_app(orch), headers={"Authorization": f"Bearer {mine}"})
    made = client.post("/workflows", json=_research())
    assert (made.status_code, made.json()["ref"], made.json()["created"]) == (
        201,
        "research@1",
        True,
    )
    again = client.post("/workflows", json=_research())
    assert (again.status_code, again.json()["created"]) == (200, False)
    assert [one["ref"] for one in client.get("/workflows").json()] == ["research@1"]
    assert client.get("/workflows/research@1").json()["definition"]["name"] == "research"
    run = client.post("/runs", json={"workflow": "research@1", "args": {"topic": "otters"}})
    assert (run.status_code, run.json()["workflow_version"]) == (201, 1)
    bad = client.post("/runs", json={"workflow": "research", "args": {"topic": 1}})
    assert (bad.status_code, bad.json()["error"]["field"]) == (400, "args.topic")
    refused = client.post("/workflows", json={"name": "x", "steps": []})
    assert refused.status_code == 400
    other = client.get("/workflows", headers={"Authorization": f"Bearer {theirs}"})
    assert other.json() == []
    hidden = client.get("/workflows/research", headers={"Authorization": f"Bearer {theirs}"})
    assert hidden.status_code == 400


def test_the_cli_registers_lists_shows_and_launches_by_name(
    settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "research.yaml"
    path.write_text(yaml.safe_dump(_research()))
    run = cli(settings, OWNER, cwd=tmp_path)

    made = run("workflows", "register", str(path), "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["ref"] == "research@1"
    assert "unchanged: research@1" in run("workflows", "register", str(path)).stdout
    assert "research@1" in run("workflows", "list").stdout
    shown = json.loads(run("workflows", "show", "research").stdout)
    assert shown["definition"]["args_schema"] == SCHEMA
    bad = run("launch", "research", "--args", '{"topic": 7}', "--json")
    assert bad.returncode == 2
    assert json.loads(bad.stderr)["error"]["field"] == "args.topic"
    with session_scope(settings.database_url) as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 0
