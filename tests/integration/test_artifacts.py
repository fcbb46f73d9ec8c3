"""Artifacts through a real prefork worker and the real database (PostgreSQL in CI): a big
output leaves its row, the next step's template reads it, the API streams it checked against
its hash, and another owner reads nothing."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import ArtifactNotFound
from orchestration.core.models import Artifact, Step
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from tests.integration.conftest import Stack
from tests.support.runs import finished

pytestmark = pytest.mark.integration

STACK_SETTINGS = {"ORCH_INLINE_OUTPUT_BYTES": "1024"}
#: 40 KB of text with characters JSON escapes and characters outside ASCII, so the stored
#: bytes and the value read back are compared in full.
BIG = ('quote " backslash \\ tab \t é ✓ ' * 1200)[:40000]


def _flow() -> dict[str, Any]:
    def step(step_id: str, task: str, **options: Any) -> dict[str, Any]:
        return {
            "id": step_id,
            "provider": "scripted",
            "task": task,
            "poll_interval": 0.1,
            "max_poll_interval": 0.5,
            "with": {"states": [["running", 0.2], ["idle"]], **options},
        }

    return {
        "name": "artifacts",
        "steps": [
            step("fetch", "go", output={"pages": BIG}),
            step("use", "{{ steps.fetch.output.pages }}"),
        ],
    }


def test_a_big_output_is_stored_once_read_by_the_next_step_and_streamed(
    worker: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    run = orch.launch(_flow(), owner=owner)
    done = finished(orch, run.id, owner)
    assert done.status == "completed", done.error
    fetch, use = done.steps
    assert fetch.output is None and fetch.output_artifact is not None
    assert fetch.output_artifact["media_type"] == "application/json"
    assert use.input == BIG  # the worker's template read the artifact's value
    assert use.output_artifact is not None and done.result_artifact == use.output_artifact
    with session_scope(stack.settings.database_url) as session:
        rows = session.scalars(select(Artifact).where(Artifact.owner == owner)).all()
        assert {row.sha256 for row in rows} == {
            fetch.output_artifact["sha256"],
            use.output_artifact["sha256"],
        }
        assert all(hashlib.sha256(row.content or b"").hexdigest() == row.sha256 for row in rows)
        refs = session.scalars(select(Step.output_sha256).where(Step.run_id == run.id)).all()
        assert set(refs) == {row.sha256 for row in rows}
        token = tokens.create(session, owner, "t", now=utcnow())
    client = TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"})
    reply = client.get(f"/runs/{run.id}/steps/use/output")
    assert reply.status_code == 200
    assert reply.text == BIG
    assert reply.headers["etag"] == f'"{use.output_artifact["sha256"]}"'
    with pytest.raises(ArtifactNotFound):
        list(orch.artifact_bytes(use.output_artifact["sha256"], owner=owner + "-other"))
