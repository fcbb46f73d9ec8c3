"""Per-owner budgets on PostgreSQL (issue 30): the launch's one statement reads the owner's
own value (``owner_budgets``) beside the counts, so an operator's value decides the launch in
the same statement that writes it, with no read before it to race.

In-process against the module's PostgreSQL database. Skipped without
``ORCH_TEST_DATABASE_URL``."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select

from orchestration.core.db import session_scope
from orchestration.core.errors import LimitExceeded
from orchestration.core.models import Run
from orchestration.limits import owner_budgets
from tests.conftest import DATABASE_URL
from tests.integration.conftest import Stack
from tests.support.statements import sent
from tests.unit.support import T0, launch, step_spec, workflow

pytestmark = pytest.mark.skipif(
    not DATABASE_URL, reason="needs PostgreSQL (ORCH_TEST_DATABASE_URL): SQLite has no DML CTEs"
)


def _own(stack: Stack, owner: str, runs: int | None) -> None:
    with session_scope(stack.settings.database_url) as session:
        owner_budgets.set_own(session, owner, {"max_active_runs": runs}, T0)


def test_the_launch_statement_reads_the_owners_own_value(stack: Stack) -> None:
    settings = stack.settings
    owner = f"budgeted-{uuid.uuid4().hex[:8]}"
    _own(stack, owner, 1)
    with sent(settings) as seen:
        launch(settings, workflow(step_spec()), owner=owner, request_id=uuid.uuid4().hex)
    # One statement in autocommit, and the owner's value read in it.
    assert len(seen.texts) == 1 and seen.statements[0][1]
    assert "owner_budgets" in seen.texts[0][0]
    with sent(settings) as seen, pytest.raises(LimitExceeded) as refused:
        launch(settings, workflow(step_spec()), owner=owner, request_id=uuid.uuid4().hex)
    assert "has 1 active runs (branch runs included), the limit of 1" in str(refused.value)
    assert "ORCH_MAX_ACTIVE_RUNS_PER_OWNER, or the owner's own --max-active-runs" in str(
        refused.value
    )
    # The statement wrote nothing; the transaction that worded the refusal read the same.
    assert seen.statements[0] == ("WITH", True)
    _own(stack, owner, 2)
    with sent(settings) as seen:
        launch(settings, workflow(step_spec()), owner=owner, request_id=uuid.uuid4().hex)
    assert len(seen.texts) == 1
    # Back to the setting (the module's default, far above two).
    _own(stack, owner, None)
    launch(settings, workflow(step_spec()), owner=owner, request_id=uuid.uuid4().hex)
    with session_scope(settings.database_url) as session:
        count = session.scalar(select(func.count()).select_from(Run).where(Run.owner == owner))
    assert count == 3
