"""Files in an output (issue 32): a part ``{"file": {..., "sha256", "size", "base64"}}`` is
stored once as an artifact of the run's owner by its hash, the output keeps the reference
without the bytes, bytes that do not hash as claimed fail the step, the stored-bytes budget
refuses what would pass it, the owner (only) reads the file back by its hash, and delete and
prune keep a file while an output names it."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import ArtifactNotFound
from orchestration.core.followups import Done
from orchestration.core.models import Artifact, Step
from orchestration.core.settings import Settings
from orchestration.runs import deletion
from orchestration.runtime.executor import Executor
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.upkeep import retention
from tests.unit.support import launch, step_spec
from tests.unit.test_artifacts import BIG, INLINE
from tests.unit.test_branches import OWNER, World

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
OTHER = b"another file's bytes"


def _part(data: bytes, name: str = "chart.png", *, sha256: str | None = None) -> dict[str, Any]:
    """A file part with its bytes, as the ``a2a`` provider answers one given inline."""
    return {
        "file": {
            "name": name,
            "media_type": "image/png",
            "sha256": sha256 or hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "base64": base64.b64encode(data).decode(),
        }
    }


def _reference(data: bytes, name: str = "chart.png") -> dict[str, Any]:
    return {
        "file": {
            "name": name,
            "media_type": "image/png",
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        }
    }


def _flow(*outputs: Any) -> dict[str, Any]:
    """One step per output, each answering it."""
    return {
        "name": "files",
        "steps": [
            step_spec(f"s{n}", with_={"states": [["completed"]], "output": output})
            for n, output in enumerate(outputs)
        ],
    }


def _artifacts(settings: Settings) -> list[tuple[str, str, int, str, bytes | None]]:
    with session_scope(settings.database_url) as session:
        rows = session.execute(
            select(
                Artifact.owner,
                Artifact.sha256,
                Artifact.size,
                Artifact.media_type,
                Artifact.content,
            ).order_by(Artifact.owner, Artifact.sha256)
        ).all()
        return [tuple(row) for row in rows]  # type: ignore[misc]


@pytest.fixture
def world(settings_factory: Callable[..., Settings]) -> World:
    return World(settings_factory(inline_output_bytes=INLINE))


def test_a_file_is_stored_once_by_its_hash_and_the_output_keeps_only_its_reference(
    world: World,
) -> None:
    run_id = world.launch(_flow(["see the chart", _part(PNG)], _part(PNG)))
    world.pump()
    record = world.record(run_id)
    assert record.status == "completed"
    first, second = record.steps
    assert first.output == ["see the chart", _reference(PNG)]
    assert second.output == _reference(PNG)
    assert record.result == _reference(PNG)
    sha256 = hashlib.sha256(PNG).hexdigest()
    # Two steps answered the same bytes: one row, the owner's, holding them.
    assert _artifacts(world.settings) == [(OWNER, sha256, len(PNG), "image/png", PNG)]
    found = world.orch.artifact(sha256, owner=OWNER)
    assert found == {"sha256": sha256, "size": len(PNG), "media_type": "image/png"}
    assert b"".join(world.orch.artifact_bytes(sha256, owner=OWNER)) == PNG


def test_the_owner_reads_a_file_back_by_its_hash_and_no_other_owner_does(world: World) -> None:
    world.launch(_flow(_part(PNG)))
    launch(world.settings, _flow(_part(OTHER)), owner="owner-2", dispatcher=world.queue)
    world.pump()
    mine, theirs = hashlib.sha256(PNG).hexdigest(), hashlib.sha256(OTHER).hexdigest()
    with session_scope(world.settings.database_url) as session:
        token = tokens.create(session, OWNER, "t", now=utcnow())
    client = TestClient(create_app(world.orch), headers={"Authorization": f"Bearer {token}"})
    reply = client.get(f"/artifacts/{mine}")
    assert reply.status_code == 200
    assert reply.content == PNG
    assert reply.headers["content-type"] == "image/png"
    assert (reply.headers["etag"], reply.headers["content-length"]) == (f'"{mine}"', str(len(PNG)))
    # Another owner's file is not found, though its hash is known and its bytes stored.
    assert client.get(f"/artifacts/{theirs}").status_code == 404
    assert client.get(f"/artifacts/{'0' * 64}").status_code == 404
    with pytest.raises(ArtifactNotFound):
        world.orch.artifact(mine, owner="owner-2")


def test_bytes_that_do_not_hash_as_claimed_fail_the_step_and_store_nothing(world: World) -> None:
    claimed = hashlib.sha256(b"something else").hexdigest()
    run_id = world.launch(_flow(["text", _part(PNG, sha256=claimed)]))
    world.pump()
    record = world.record(run_id)
    assert (record.status, record.stop_reason) == ("failed", "step_failed")
    assert f"hash to sha256:{hashlib.sha256(PNG).hexdigest()}" in (record.error or "")
    assert f"not the sha256:{claimed}" in (record.error or "")
    assert record.steps[0].output is None
    assert _artifacts(world.settings) == []


def test_the_stored_bytes_budget_refuses_a_new_file_and_not_one_already_stored(
    settings_factory: Callable[..., Settings],
) -> None:
    # 1500: the file's 1032 bytes and the inline outputs naming it (about 150 bytes each).
    world = World(settings_factory(inline_output_bytes=INLINE, max_stored_bytes_per_owner=1500))
    stored = world.launch(_flow(_part(PNG)))  # 1032 bytes: fits
    world.pump()
    again = world.launch(_flow(_part(PNG, name="same.png")))  # the same bytes: cost nothing
    over = world.launch(_flow(_part(PNG + b"!")))  # 1033 more: over
    world.pump()
    assert world.record(stored).status == "completed"
    assert world.record(again).status == "completed"
    assert world.record(again).steps[0].output == _reference(PNG, "same.png")
    record = world.record(over)
    assert (record.status, record.stop_reason) == ("failed", "over_limit")
    assert "ORCH_MAX_STORED_BYTES_PER_OWNER" in (record.error or "")
    assert [row[1] for row in _artifacts(world.settings)] == [hashlib.sha256(PNG).hexdigest()]


def test_a_refused_output_undoes_the_store_of_its_files(
    settings_factory: Callable[..., Settings],
) -> None:
    world = World(
        settings_factory(
            inline_output_bytes=INLINE, max_output_bytes=5000, max_run_output_bytes=5000
        )
    )
    run_id = world.launch(_flow([BIG, _part(OTHER)], [BIG + "!", _part(PNG)]))
    world.pump()
    record = world.record(run_id)
    assert (record.status, record.stop_reason) == ("failed", "over_limit")
    assert "ORCH_MAX_RUN_OUTPUT_BYTES" in (record.error or "")
    # The first step's output and file are kept; the second's file went with its output.
    kept = {row[1] for row in _artifacts(world.settings)}
    assert hashlib.sha256(OTHER).hexdigest() in kept
    assert hashlib.sha256(PNG).hexdigest() not in kept


def test_an_output_stored_as_an_artifact_lists_the_files_it_names(world: World) -> None:
    run_id = world.launch(_flow([BIG, _part(PNG)]))
    world.pump()
    assert world.record(run_id).status == "completed"
    sha256 = hashlib.sha256(PNG).hexdigest()
    with session_scope(world.settings.database_url) as session:
        row = session.scalars(select(Step).where(Step.run_id == run_id)).one()
        assert row.output_sha256 is not None
        assert row.output["files"] == [sha256]
    assert world.orch.output(run_id, "s0", owner=OWNER).artifact is not None
    value = json.loads(b"".join(world.orch.artifact_bytes(row.output_sha256, owner=OWNER)))
    assert value == [BIG, _reference(PNG)]


def _delete(world: World, run_id: str) -> deletion.Deletion:
    return retention.delete_run(
        world.executor, world.settings, run_id, owner=OWNER, by="test", now=world.clock.now
    )


def test_delete_keeps_a_file_while_an_output_names_it_and_then_deletes_it(world: World) -> None:
    first = world.launch(_flow(["one", _part(PNG)]))
    second = world.launch(_flow([BIG, _part(PNG)]))  # names it through its artifact's list
    world.pump()
    sha256 = hashlib.sha256(PNG).hexdigest()
    assert _delete(world, first).artifacts == 0
    assert sha256 in {row[1] for row in _artifacts(world.settings)}
    assert b"".join(world.orch.artifact_bytes(sha256, owner=OWNER)) == PNG
    assert _delete(world, second).artifacts == 2  # its output and the file
    assert _artifacts(world.settings) == []


def test_prune_keeps_a_file_a_recent_output_names_and_then_deletes_it(world: World) -> None:
    world.launch(_flow(_part(PNG)))
    world.pump()
    world.clock.advance(40 * 86400)
    recent = world.launch(_flow(["again", _part(PNG)]))
    world.pump()
    world.clock.advance(40 * 86400)
    executor = Executor(world.settings, None)
    # The old run goes; the file's store was stamped since, and the recent run names it.
    cutoff = world.clock.now - timedelta(days=60)
    assert retention.prune(executor, cutoff=cutoff, dry_run=True)["artifacts"] == 0
    report = retention.prune(executor, cutoff=cutoff)
    assert (report["runs"], report["artifacts"]) == (1, 0)
    assert b"".join(world.orch.artifact_bytes(hashlib.sha256(PNG).hexdigest(), owner=OWNER)) == PNG
    assert world.record(recent).status == "completed"
    cutoff = world.clock.now - timedelta(days=30)
    assert retention.prune(executor, cutoff=cutoff, dry_run=True)["artifacts"] == 1
    report = retention.prune(executor, cutoff=cutoff)
    assert (report["runs"], report["artifacts"]) == (1, 1)
    assert _artifacts(world.settings) == []


def test_prune_deletes_a_file_stored_long_ago_only_with_the_last_run_naming_it(
    world: World,
) -> None:
    world.launch(_flow(_part(PNG)))
    world.clock.advance(60)
    world.launch(_flow({"report": [_part(PNG)]}))  # named deeper in the output
    world.pump()
    world.clock.advance(40 * 86400)
    cutoff = world.clock.now - timedelta(days=30)
    executor = Executor(world.settings, None)
    sha256 = hashlib.sha256(PNG).hexdigest()
    assert retention.prune(executor, cutoff=cutoff, dry_run=True)["artifacts"] == 1
    # One run per batch: the first batch leaves the file, the second run still names it.
    first = executor(lambda session: Done(retention.delete_batch(session, cutoff, 1)))
    assert (first["runs"], first["artifacts"], first["unnamed"]) == (1, 0, [])
    assert b"".join(world.orch.artifact_bytes(sha256, owner=OWNER)) == PNG
    second = executor(lambda session: Done(retention.delete_batch(session, cutoff, 1)))
    assert (second["runs"], second["artifacts"], second["unnamed"]) == (1, 1, [sha256])
    assert _artifacts(world.settings) == []


def test_a_branch_join_stored_as_an_artifact_lists_the_files_its_branches_named(
    world: World,
) -> None:
    flow = {
        "name": "gather",
        "steps": [
            {
                "id": "gather",
                "for_each": "{{ args.items }}",
                "step": {
                    "provider": "scripted",
                    "task": "{{ item }}",
                    "poll_interval": 0.1,
                    "with": {"states": [["completed"]], "output": [BIG, _part(PNG)]},
                },
            }
        ],
    }
    run_id = world.launch(flow, {"items": ["a", "b"]})
    world.pump()
    assert world.record(run_id).status == "completed"
    with session_scope(world.settings.database_url) as session:
        row = session.scalars(select(Step).where(Step.run_id == run_id)).one()
        assert row.output_sha256 is not None
        assert row.output["files"] == [hashlib.sha256(PNG).hexdigest()]


def test_a_rerun_that_reuses_an_output_keeps_its_file_when_the_source_is_deleted(
    world: World,
) -> None:
    flow = _flow(["kept", _part(PNG)], "second")
    flow["steps"][1]["with"] = {"states": [["failed"]]}
    source = world.launch(flow)
    world.pump()
    assert world.record(source).status == "failed"
    world.clock.advance(60)
    rerun = world.orch.rerun(source, owner=OWNER)
    world.pump()
    assert world.record(rerun.id).steps[0].output == ["kept", _reference(PNG)]
    sha256 = hashlib.sha256(PNG).hexdigest()
    with session_scope(world.settings.database_url) as session:
        used_at = session.scalar(select(Artifact.used_at).where(Artifact.sha256 == sha256))
    assert used_at == rerun.created_at  # stamped by the rerun, so a prune running now keeps it
    assert _delete(world, source).artifacts == 0
    assert b"".join(world.orch.artifact_bytes(sha256, owner=OWNER)) == PNG
