"""An owner's stored bytes count its outputs kept inline in their steps' rows (issue 30):
the database counts each inline output's stored JSON as it is written, changed or deleted
(migration 0023), so ``ORCH_MAX_STORED_BYTES_PER_OWNER`` bounds the small outputs of an
owner's kept runs as well as its artifacts, and the count comes back to nothing once the
runs are gone, however they go."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from alembic import command
from sqlalchemy import delete, func, select, text, update

from orchestration.core.db import alembic_config, session_scope, upgrade
from orchestration.core.errors import LimitExceeded
from orchestration.core.models import Artifact, InlineOutputBytes, Run, Step
from orchestration.core.settings import Settings
from orchestration.limits import owner_use
from orchestration.runtime.executor import Executor
from orchestration.upkeep import retention
from tests.unit.support import cli, launch, step_spec, workflow
from tests.unit.test_branches import OWNER, World

INLINE = 1024


def _answer() -> dict[str, object]:
    """A step that answers its task: ``args.text`` becomes its output."""
    return workflow(step_spec(task="{{ args.text }}", with_={"states": [["completed"]]}))


@pytest.fixture
def world(settings_factory: Callable[..., Settings]) -> World:
    return World(settings_factory(inline_output_bytes=INLINE))


def _ran(world: World, text_: str) -> str:
    run_id = world.launch(_answer(), {"text": text_})
    world.pump()
    assert world.record(run_id).status == "completed"
    return run_id


def _stored(world: World, owner: str = OWNER) -> int:
    with session_scope(world.settings.database_url) as session:
        return int(session.scalar(select(owner_use.stored_bytes(owner))) or 0)


def _inline(world: World, owner: str = OWNER) -> int:
    """The owner's counted inline bytes, as the rows hold them."""
    with session_scope(world.settings.database_url) as session:
        summed = select(func.coalesce(func.sum(InlineOutputBytes.bytes), 0))
        return int(session.scalar(summed.where(InlineOutputBytes.owner == owner)) or 0)


def test_kept_runs_inline_outputs_count_in_owners_show_and_refuse_a_launch(world: World) -> None:
    for letter in "abc":
        _ran(world, letter * 300)
    # Each output is the JSON string "aaa…": 300 bytes and its two quotes.
    assert _stored(world) == 3 * 302
    assert _stored(world, "other") == 0
    run = cli(world.settings)
    shown = json.loads(run("owners", "show", OWNER, "--json").stdout)["budgets"]
    assert ("owner_stored_bytes", 906) in [(b["budget"], b["used"]) for b in shown]
    assert run("owners", "set", OWNER, "--max-stored-bytes", "906").returncode == 0
    with pytest.raises(LimitExceeded) as refused:
        world.launch(_answer(), {"text": "d"})
    assert refused.value.problem == (
        f"owner '{OWNER}' has 906 stored bytes (the outputs and artifacts of live and kept "
        "runs), the limit of 906 (ORCH_MAX_STORED_BYTES_PER_OWNER, or the owner's own "
        "--max-stored-bytes); prune ended runs (orchestration prune) or ask an operator to "
        "raise it"
    )
    launch(world.settings, _answer(), {"text": "d"}, owner="other")


def test_an_artifact_is_counted_once_and_its_reference_not_at_all(world: World) -> None:
    _ran(world, "x" * 3000)
    with session_scope(world.settings.database_url) as session:
        sizes = list(session.scalars(select(Artifact.size)))
    assert sizes == [3000]  # the text, stored as an artifact
    assert _inline(world) == 0
    assert _stored(world) == 3000


def test_a_changed_output_counts_its_new_size_only(world: World) -> None:
    run_id = _ran(world, "a" * 100)
    assert _stored(world) == 102
    where = (Step.run_id == run_id, Step.index == 0)
    with session_scope(world.settings.database_url) as session:
        # A retry's new output overwrites the first.
        session.execute(update(Step).where(*where).values(output="b" * 40))
    assert _stored(world) == 42
    with session_scope(world.settings.database_url) as session:
        session.execute(update(Step).where(*where).values(output={"n": 1}, output_sha256="0" * 64))
    assert _stored(world) == 0  # a reference: its artifact is what counts
    with session_scope(world.settings.database_url) as session:
        session.execute(update(Step).where(*where).values(output=None, output_sha256=None))
        session.execute(update(Step).where(*where).values(output="c" * 10))
        session.execute(update(Step).where(*where).values(error="touched"))  # not the output
    assert _stored(world) == 12


def test_deleted_and_pruned_runs_bring_the_count_back_to_nothing(world: World) -> None:
    deleted = _ran(world, "a" * 100)
    pruned = _ran(world, "b" * 200)
    assert _stored(world) == 102 + 202
    retention.delete_run(
        world.executor, world.settings, deleted, owner=OWNER, by="test", now=world.clock.now
    )
    assert _stored(world) == 202
    world.clock.advance(40 * 86400)
    report = retention.prune(Executor(world.settings, None), cutoff=world.clock.now)
    assert report["runs"] == 1
    with session_scope(world.settings.database_url) as session:
        assert session.scalar(select(func.count()).select_from(Run).where(Run.id == pruned)) == 0
    assert _inline(world) == 0


def test_a_run_deleted_by_the_foreign_keys_cascade_takes_its_bytes_away(world: World) -> None:
    first, second = _ran(world, "a" * 100), _ran(world, "b" * 200)
    with session_scope(world.settings.database_url) as session:
        session.execute(delete(Run).where(Run.id == first))
    assert _inline(world) == 202
    with session_scope(world.settings.database_url) as session:
        # Written and deleted in one transaction: the write is counted before the delete.
        session.execute(update(Step).where(Step.run_id == second).values(output="c" * 1000))
        session.execute(delete(Run).where(Run.id == second))
    assert _inline(world) == 0
    third = _ran(world, "d" * 50)
    with session_scope(world.settings.database_url) as session:
        session.execute(update(Step).where(Step.run_id == third).values(output="e" * 500))
        session.execute(delete(Step).where(Step.run_id == third))
        session.execute(delete(Run).where(Run.id == third))
    assert _inline(world) == 0


def test_the_migration_counts_the_inline_outputs_already_there(world: World) -> None:
    _ran(world, "a" * 100)
    _ran(world, "x" * 3000)
    url = world.settings.database_url
    command.downgrade(alembic_config(url), "0022")
    upgrade(url)
    assert _inline(world) == 102
    assert _stored(world) == 102 + 3000
    with session_scope(url) as session:
        session.execute(delete(Run))
    assert _inline(world) == 0


@pytest.mark.postgresql_only("TRUNCATE's trigger is PostgreSQL's (SQLite has no TRUNCATE)")
def test_a_truncate_of_runs_empties_the_counts(world: World) -> None:
    _ran(world, "a" * 100)
    with session_scope(world.settings.database_url) as session:
        session.execute(text("TRUNCATE runs CASCADE"))
    assert _inline(world) == 0
    _ran(world, "b" * 10)
    assert _inline(world) == 12
