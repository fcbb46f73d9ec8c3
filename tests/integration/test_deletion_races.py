"""Deleting a run on PostgreSQL (issue 32): a delete is one transaction that locks the run only
if it is the owner's and terminal, so two deletes of one run never meet a half-deleted run (the
second waits, then finds nothing), and an artifact that a concurrent transaction starts
referencing while the delete runs is kept (its row is locked before the check)."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text

from orchestration.core.db import normalize_url, session_scope, utcnow
from orchestration.core.errors import RunNotFound
from orchestration.core.models import Artifact, RunDeletion
from orchestration.runs import deletion
from orchestration.runtime.executor import Executor
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from orchestration.upkeep import retention
from tests.conftest import wait_for
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

STACK_SETTINGS = {"ORCH_INLINE_OUTPUT_BYTES": "64"}
BIG = "y" * 500


def _flow(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "steps": [
            {
                "id": "s1",
                "provider": "scripted",
                "task": "{{ args.text }}",
                "poll_interval": 0.2,
                "max_poll_interval": 1.0,
                "with": {"states": [["completed"]]},
            }
        ],
    }


def _completed(orch: Orchestrator, owner: str, text_value: str) -> str:
    run_id = orch.launch(_flow("deletable"), {"text": text_value}, owner=owner).id
    wait_for(
        lambda: orch.get(run_id, owner=owner).status == "completed", timeout=60, what="completed"
    )
    return run_id


def _waiting_on_a_lock(engine: Any) -> bool:
    """Whether some session of the test database waits on a row lock."""
    with engine.connect() as connection:
        return bool(
            connection.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            )
        )


def _postgres(stack: Stack) -> None:
    if not stack.settings.database_url.startswith("postgres"):
        pytest.skip("row locks between sessions: PostgreSQL only (SQLite has one writer)")


def _delete_in_thread(stack: Stack, run_id: str, owner: str) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def delete() -> None:
        try:
            outcome.append(
                retention.delete_run(
                    Executor(stack.settings, None),
                    stack.settings,
                    run_id,
                    owner=owner,
                    by="second",
                    now=utcnow(),
                )
            )
        except Exception as exc:  # the outcome is what the test asserts on
            outcome.append(exc)

    thread = threading.Thread(target=delete)
    thread.start()
    return thread, outcome


def test_two_deletes_of_one_run_the_second_waits_then_finds_nothing(
    stack: Stack, worker: ManagedProcess, owner: str
) -> None:
    _postgres(stack)
    orch = stack.orchestrator()
    run_id = _completed(orch, owner, "short")
    observer = create_engine(normalize_url(stack.settings.database_url))
    with session_scope(stack.settings.database_url) as first:
        done = deletion.delete_owned(
            first, stack.settings, run_id, owner=owner, by="first", now=utcnow()
        )
        assert done.run_id == run_id
        thread, outcome = _delete_in_thread(stack, run_id, owner)
        wait_for(lambda: _waiting_on_a_lock(observer), timeout=30, what="the second delete waits")
        assert not outcome  # it holds no half-deleted view: it is waiting for the first
    thread.join(timeout=60)
    observer.dispose()
    assert len(outcome) == 1 and isinstance(outcome[0], RunNotFound), outcome
    with session_scope(stack.settings.database_url) as session:
        audit = session.execute(select(RunDeletion.by).where(RunDeletion.run_id == run_id)).all()
    assert [row.by for row in audit] == ["first"]


def test_an_artifact_referenced_by_a_concurrent_transaction_is_kept(
    stack: Stack, worker: ManagedProcess, owner: str
) -> None:
    _postgres(stack)
    orch = stack.orchestrator()
    source = _completed(orch, owner, BIG)
    other = _completed(orch, owner, BIG + "!")
    sha256 = hashlib.sha256(BIG.encode()).hexdigest()
    holder = create_engine(normalize_url(stack.settings.database_url))
    observer = create_engine(normalize_url(stack.settings.database_url))
    with holder.connect() as connection:
        # What a rerun or a launch does when it references the same bytes again: it stamps
        # the artifact's row and writes a step naming it, not yet committed.
        connection.execute(
            text("UPDATE artifacts SET used_at = now() WHERE owner = :o AND sha256 = :h"),
            {"o": owner, "h": sha256},
        )
        connection.execute(
            text("UPDATE steps SET output_sha256 = :h WHERE run_id = :r"),
            {"h": sha256, "r": other},
        )
        thread, outcome = _delete_in_thread(stack, source, owner)
        wait_for(lambda: _waiting_on_a_lock(observer), timeout=30, what="the delete waits")
        connection.commit()
    thread.join(timeout=60)
    holder.dispose()
    observer.dispose()
    (done,) = outcome
    assert isinstance(done, deletion.Deletion), done
    assert done.artifacts == 0
    with session_scope(stack.settings.database_url) as session:
        kept = session.scalar(
            select(func.count())
            .select_from(Artifact)
            .where(Artifact.owner == owner, Artifact.sha256 == sha256)
        )
    assert kept == 1
