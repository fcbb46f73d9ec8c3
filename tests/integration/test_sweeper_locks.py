"""A worker frozen inside a transaction holds its run's row; the sweeper must skip that run
for the pass and still sweep every other one (chaos finding A). PostgreSQL only: SQLite has
one lock for the whole file, which is why it is not for production (docs/operations.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import create_engine, text

from orchestration.core.db import normalize_url, utcnow
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.upkeep.sweeper import Sweeper
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

WORKFLOW = {
    "name": "locks",
    "steps": [
        {
            "id": "s1",
            "provider": "scripted",
            "task": "go",
            "poll_interval": 0.2,
            "max_poll_interval": 1.0,
            "with": {"states": [["running"]]},
        }
    ],
}


def test_a_locked_run_is_skipped_and_the_others_are_swept(stack: Stack, owner: str) -> None:
    if not stack.settings.database_url.startswith("postgres"):
        pytest.skip("row locks: PostgreSQL only (SQLite locks the whole database)")
    writer = Orchestrator(stack.settings, None)  # rows written, chains never sent
    frozen, free = (writer.launch(WORKFLOW, owner=owner).id for _ in range(2))
    holder = create_engine(normalize_url(stack.settings.database_url))
    with holder.connect() as connection:
        # The frozen worker: a transaction that updated the run's row and went to sleep.
        connection.execute(
            text("UPDATE runs SET updated_at = now() WHERE id = :id"), {"id": frozen}
        )
        later = utcnow() + timedelta(seconds=stack.settings.heartbeat_timeout + 1)
        report = Sweeper(stack.settings, Executor(stack.settings, None)).sweep(later)
        connection.rollback()
    holder.dispose()
    assert report["busy"] == 1 and report["rearmed"] == 1, report
    assert report["seconds"] < 3 * stack.settings.sweep_interval + 2, report
    assert writer.get(free, owner=owner).rearms == 1
    assert writer.get(frozen, owner=owner).rearms == 0
