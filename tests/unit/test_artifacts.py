"""Artifacts (issue 13): an output over ``ORCH_INLINE_OUTPUT_BYTES`` is stored once per owner
by its sha256, the row keeps ``{sha256, size, media_type}``, templates and the API resolve it,
every read checks the hash, the bounds name their setting, and prune deletes what nothing
references any more."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import ArtifactCorrupt, ArtifactNotFound, RunNotFound
from orchestration.core.models import Artifact, Run, Step
from orchestration.core.settings import Settings
from orchestration.runs import artifacts
from orchestration.runtime.executor import Executor
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.upkeep import retention
from tests.unit.support import launch, step_spec
from tests.unit.test_branches import OWNER, World

BIG = "x" * 3000 + " the end"
INLINE = 1024


def _flow(text_of_b: str = "{{ steps.a.output }}") -> dict[str, Any]:
    """Step ``a`` answers its task (a long text), ``b`` reads it through a template."""
    return {
        "name": "big",
        "steps": [
            step_spec("a", task="{{ args.text }}", with_={"states": [["completed"]]}),
            step_spec("b", task=text_of_b, with_={"states": [["completed"]]}),
        ],
    }


@pytest.fixture
def world(settings_factory: Callable[..., Settings]) -> World:
    return World(settings_factory(inline_output_bytes=INLINE))


def _artifacts(settings: Settings) -> list[Artifact]:
    with session_scope(settings.database_url) as session:
        rows = list(session.scalars(select(Artifact).order_by(Artifact.owner)))
        session.expunge_all()
        return rows


def test_a_big_output_is_an_artifact_the_next_template_and_the_api_resolve(world: World) -> None:
    run_id = world.launch(_flow(), {"text": BIG})
    world.pump()
    record = world.record(run_id)
    assert record.status == "completed"
    a, b = record.steps
    sha256 = hashlib.sha256(BIG.encode()).hexdigest()
    reference = {"sha256": sha256, "size": len(BIG), "media_type": artifacts.TEXT}
    assert (a.output, a.output_artifact) == (None, reference)
    assert b.input == BIG  # the template read the artifact's value, not the reference
    assert (record.result, record.result_artifact) == (None, reference)  # b answers BIG too
    with session_scope(world.settings.database_url) as session:
        row = session.scalars(select(Step).where(Step.run_id == run_id, Step.index == 0)).one()
        assert (row.output, row.output_sha256) == (reference, sha256)
    (stored,) = _artifacts(world.settings)  # a and b answered the same bytes: stored once
    assert (stored.owner, stored.sha256, stored.content) == (OWNER, sha256, BIG.encode())
    found = world.orch.output(run_id, "a", owner=OWNER)
    assert found.artifact == reference
    assert b"".join(world.orch.artifact_bytes(sha256, owner=OWNER)) == BIG.encode()


def test_a_small_output_stays_inline(world: World) -> None:
    run_id = world.launch(_flow(), {"text": "short"})
    world.pump()
    a, _ = world.record(run_id).steps
    assert (a.output, a.output_artifact) == ("short", None)
    assert world.orch.output(run_id, "a", owner=OWNER).value == "short"
    assert _artifacts(world.settings) == []


def test_a_json_output_is_stored_as_json_and_read_back_whole(world: World) -> None:
    value = {"items": [{"n": n, "text": "y" * 40} for n in range(40)]}
    with session_scope(world.settings.database_url) as session:
        kept = artifacts.keep(
            session,
            world.settings,
            owner=OWNER,
            run_pk="r",
            step_index=0,
            value=value,
            now=utcnow(),
        )
        assert isinstance(kept, artifacts.Kept) and kept.sha256 is not None
        assert kept.value["media_type"] == artifacts.JSON
        assert artifacts.load(session, world.settings, OWNER, kept.value) == value


def test_owners_never_read_each_others_artifacts_even_knowing_the_hash(world: World) -> None:
    mine = world.launch(_flow(), {"text": BIG})
    theirs = launch(world.settings, _flow(), {"text": BIG}, owner="owner-2", dispatcher=world.queue)
    world.pump()
    sha256 = hashlib.sha256(BIG.encode()).hexdigest()
    assert [row.owner for row in _artifacts(world.settings)] == [OWNER, "owner-2"]
    with pytest.raises(RunNotFound):
        world.orch.output(mine, "a", owner="owner-2")
    with pytest.raises(ArtifactNotFound):
        list(world.orch.artifact_bytes(sha256, owner="owner-3"))
    assert world.orch.output(theirs, "a", owner="owner-2").artifact is not None


def test_changed_bytes_are_refused_on_every_read(world: World) -> None:
    run_id = world.launch(
        {**_flow(), "steps": _flow()["steps"][:1]}, {"text": BIG}
    )  # only step a: nothing reads it yet
    world.pump()
    sha256 = hashlib.sha256(BIG.encode()).hexdigest()
    with session_scope(world.settings.database_url) as session:
        session.execute(update(Artifact).values(content=BIG.upper().encode()))
    with pytest.raises(ArtifactCorrupt, match="does not match"):
        world.orch.output(run_id, "a", owner=OWNER)
    with session_scope(world.settings.database_url) as session:
        row = artifacts.meta(session, OWNER, sha256)
        with pytest.raises(ArtifactCorrupt):
            artifacts.load(session, world.settings, OWNER, artifacts.ref(sha256, row.size, "x"))
    # A later step that reads it fails the run with the reason, not with a traceback.
    reader = world.launch(_flow(), {"text": BIG})
    with session_scope(world.settings.database_url) as session:
        session.execute(update(Artifact).values(content=BIG.upper().encode()))
    world.pump()
    record = world.record(reader)
    assert record.status == "failed"
    assert "does not match its bytes" in (record.error or "")


def test_the_bounds_per_output_and_per_run_name_their_setting(
    settings_factory: Callable[..., Settings],
) -> None:
    world = World(settings_factory(inline_output_bytes=INLINE, max_output_bytes=2500))
    run_id = world.launch(_flow(), {"text": BIG})
    world.pump()
    record = world.record(run_id)
    assert (record.status, record.stop_reason) == ("failed", "over_limit")
    assert "ORCH_MAX_OUTPUT_BYTES" in (record.error or "")

    world = World(
        settings_factory(
            inline_output_bytes=INLINE, max_output_bytes=5000, max_run_output_bytes=5000
        )
    )
    run_id = world.launch(_flow("{{ steps.a.output }} and more"), {"text": BIG})
    world.pump()
    record = world.record(run_id)
    assert (record.status, record.stop_reason) == ("failed", "over_limit")
    assert "ORCH_MAX_RUN_OUTPUT_BYTES" in (record.error or "")
    assert record.steps[0].output_artifact is not None  # step a fitted; b would not


def test_a_shared_folder_keeps_the_bytes_and_prune_removes_them(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> None:
    folder = tmp_path / "artifacts"
    world = World(settings_factory(inline_output_bytes=INLINE, artifact_dir=str(folder)))
    old = world.launch(_flow(), {"text": BIG})
    world.pump()
    sha256 = hashlib.sha256(BIG.encode()).hexdigest()
    path = artifacts.file_path(folder, sha256)
    assert path.read_bytes() == BIG.encode()
    (row,) = _artifacts(world.settings)
    assert row.content is None
    assert b"".join(world.orch.artifact_bytes(sha256, owner=OWNER)) == BIG.encode()
    path.write_bytes(BIG.upper().encode())
    with pytest.raises(ArtifactCorrupt):
        world.orch.output(old, "a", owner=OWNER)
    world.clock.advance(40 * 86400)
    report = retention.prune(
        Executor(world.settings, None),
        cutoff=world.clock.now - timedelta(days=30),
        artifact_dir=str(folder),
    )
    assert (report["runs"], report["artifacts"]) == (1, 1)
    assert not path.exists()


def test_prune_keeps_an_artifact_a_recent_run_still_references(world: World) -> None:
    world.launch(_flow(), {"text": BIG})
    other = world.launch(_flow(), {"text": BIG + "!"})
    world.pump()
    world.clock.advance(40 * 86400)
    recent = world.launch(_flow(), {"text": BIG})  # the same bytes again: used_at is stamped
    world.pump()
    cutoff = world.clock.now - timedelta(days=30)
    executor = Executor(world.settings, None)
    assert retention.prune(executor, cutoff=cutoff, dry_run=True)["artifacts"] == 1
    report = retention.prune(executor, cutoff=cutoff)
    assert (report["runs"], report["artifacts"]) == (2, 1)
    assert [row.sha256 for row in _artifacts(world.settings)] == [
        hashlib.sha256(BIG.encode()).hexdigest()
    ]
    assert world.record(recent).steps[0].output_artifact is not None
    with pytest.raises(RunNotFound):
        world.record(other)
    with session_scope(world.settings.database_url) as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 1


def test_the_api_streams_an_artifact_with_its_hash_and_serves_inline_output_as_json(
    world: World,
) -> None:
    big = world.launch(_flow(), {"text": BIG})
    small = world.launch(_flow(), {"text": "short"})
    world.pump()
    with session_scope(world.settings.database_url) as session:
        mine = tokens.create(session, OWNER, "t", now=utcnow())
        theirs = tokens.create(session, "owner-2", "t", now=utcnow())
    client = TestClient(create_app(world.orch), headers={"Authorization": f"Bearer {mine}"})
    sha256 = hashlib.sha256(BIG.encode()).hexdigest()
    reply = client.get(f"/runs/{big}/steps/a/output")
    assert reply.status_code == 200
    assert reply.content == BIG.encode()
    assert reply.headers["content-type"].startswith("text/plain")
    assert (reply.headers["etag"], reply.headers["content-length"]) == (f'"{sha256}"', "3008")
    record = client.get(f"/runs/{big}").json()
    assert record["steps"][0]["output_artifact"]["sha256"] == sha256
    # The text is in the args and the two steps' inputs; no output or result repeats it.
    assert json.dumps(record).count(BIG) == 3
    assert client.get(f"/runs/{small}/steps/a/output").json() == "short"
    assert client.get(f"/runs/{big}/steps/nope/output").status_code == 400
    other = client.get(f"/runs/{big}/steps/a/output", headers={"Authorization": f"Bearer {theirs}"})
    assert other.status_code == 404
    with session_scope(world.settings.database_url) as session:
        session.execute(update(Artifact).values(content=BIG.upper().encode()))
    corrupt = client.get(f"/runs/{big}/steps/a/output")
    assert (corrupt.status_code, corrupt.json()["error"]["code"]) == (500, "artifact_corrupt")


def test_a_rerun_reuses_an_artifact_output_by_reference_and_its_template_reads_the_value(
    world: World,
) -> None:
    flow = _flow()
    flow["steps"][1]["with"] = {"states": [["failed"]]}
    source = world.launch(flow, {"text": BIG})
    world.pump()
    assert world.record(source).status == "failed"
    world.clock.advance(60)
    at = world.clock.now
    rerun = world.orch.rerun(source, owner=OWNER)
    world.pump()
    a, b = world.record(rerun.id).steps
    assert a.output_artifact == world.record(source).steps[0].output_artifact
    assert b.input == BIG  # b, run again, rendered the reused artifact's value
    (stored,) = _artifacts(world.settings)
    assert stored.used_at == at  # stamped by the rerun, so a prune running now keeps it
