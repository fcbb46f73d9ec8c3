"""Workflow files survive YAML 1.1 and JSON alike (issue 33): ``load_file`` gives plain JSON
(``retry.on`` stays ``"on"``), a file that holds no mapping gets a clear error, and the HTTP
API's error for a ``true`` key under ``retry`` (PyYAML's reading of ``on:``) says what
happened and how to write it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from orchestration.core.db import session_scope
from orchestration.core.errors import ValidationError
from orchestration.core.settings import Settings
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.workflows import load_file
from tests.unit.support import T0

PUBLISH = Path(__file__).parents[2] / "orchestration" / "examples" / "publish.yaml"


def test_load_file_gives_plain_json_with_on() -> None:
    loaded = load_file(PUBLISH)
    assert loaded["steps"][0]["retry"]["on"] == ["failed"]
    assert json.loads(json.dumps(loaded)) == loaded
    assert '"on": ["failed"]' in json.dumps(loaded)


def test_only_true_and_false_are_booleans(tmp_path: Path) -> None:
    flow = tmp_path / "flags.yaml"
    flow.write_text(
        "name: flags\nsteps:\n  - id: a\n    provider: scripted\n    task: go\n"
        "    with: {output: [yes, no, on, off, y, n, true, false, True, FALSE]}\n",
        encoding="utf-8",
    )
    output = load_file(flow)["steps"][0]["with"]["output"]
    assert output == ["yes", "no", "on", "off", "y", "n", True, False, True, False]


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("just a string\n", "a string"),
        ("- a\n- b\n", "a list"),
        ("", "nothing"),
        ("3\n", "a number"),
    ],
)
def test_a_file_that_holds_no_mapping_is_refused(tmp_path: Path, text: str, kind: str) -> None:
    path = tmp_path / "flow.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValidationError) as refused:
        load_file(path)
    assert refused.value.field == "workflow"
    assert f"holds {kind}, not a workflow" in str(refused.value)


def _client(settings: Settings) -> TestClient:
    orch = Orchestrator(settings, None)
    with session_scope(settings.database_url) as session:
        token = tokens.create(session, "acme", "t", now=T0)
    return TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"})


def test_the_api_says_how_to_write_a_yaml_1_1_on_key(settings: Settings) -> None:
    client = _client(settings)
    read_as_yaml_1_1 = yaml.safe_load(PUBLISH.read_text(encoding="utf-8"))
    refused = client.post(
        "/workflows",
        content=json.dumps(read_as_yaml_1_1),
        headers={"Content-Type": "application/json"},
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["field"] == "steps[0].retry.true"
    assert "YAML 1.1" in error["message"] and 'quote it ("on":' in error["message"]
    assert "load_file" in error["message"]
    taken = client.post("/workflows", json=load_file(PUBLISH))
    assert taken.status_code == 201, taken.text
    stored = client.get("/workflows/publish@1").json()["definition"]
    assert stored["steps"][0]["retry"]["on"] == ["failed"]
