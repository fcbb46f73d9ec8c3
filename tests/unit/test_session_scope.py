"""How ``session_scope`` ends a block that raised: whatever the block wrote is undone, and on
PostgreSQL a block that wrote nothing (a refusal read before any write) ends with ``COMMIT``,
not ``ROLLBACK``, which would drop every prepared statement of the pooled connection for the
next request to take it, whatever its owner."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import func, select

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import LimitExceeded
from orchestration.core.models import OwnerBudget
from orchestration.core.settings import Settings
from tests.unit.support import launch, step_spec, workflow


class Refused(Exception):
    """What the blocks below raise."""


@pytest.fixture
def ended(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """How each PostgreSQL transaction ends from here on, ``commit`` or ``rollback``, as
    psycopg sends it (a call on a connection with no transaction open sends nothing)."""
    seen: list[str] = []
    for name in ("commit", "rollback"):
        sent = getattr(psycopg.Connection, name)

        def ending(connection: psycopg.Connection, name: str = name, sent: Any = sent) -> Any:
            if connection.info.transaction_status != TransactionStatus.IDLE:
                seen.append(name)
            return sent(connection)

        monkeypatch.setattr(psycopg.Connection, name, ending)
    return seen


def _budgets(settings: Settings) -> int:
    with session_scope(settings.database_url) as session:
        return int(session.scalar(select(func.count()).select_from(OwnerBudget)) or 0)


def test_what_a_block_that_raised_wrote_is_undone(settings: Settings) -> None:
    with pytest.raises(Refused), session_scope(settings.database_url) as session:
        session.add(OwnerBudget(owner="flushed", updated_at=utcnow()))
        session.flush()
        raise Refused
    with pytest.raises(Refused), session_scope(settings.database_url) as session:
        session.scalar(select(func.count()).select_from(OwnerBudget))
        session.add(OwnerBudget(owner="never flushed", updated_at=utcnow()))
        raise Refused
    assert _budgets(settings) == 0


@pytest.mark.postgresql_only("psycopg's prepared statements; SQLite prepares none")
def test_a_refusal_read_before_any_write_ends_with_commit_and_a_write_with_rollback(
    settings: Settings, ended: list[str]
) -> None:
    with pytest.raises(Refused), session_scope(settings.database_url) as session:
        session.scalar(select(func.count()).select_from(OwnerBudget))
        raise Refused
    assert ended == ["commit"]
    with pytest.raises(Refused), session_scope(settings.database_url) as session:
        session.add(OwnerBudget(owner="flushed", updated_at=utcnow()))
        session.flush()
        raise Refused
    assert ended == ["commit", "rollback"]
    assert _budgets(settings) == 0


@pytest.mark.postgresql_only("psycopg's prepared statements; SQLite prepares none")
def test_an_owners_refused_launch_sends_no_rollback(settings: Settings, ended: list[str]) -> None:
    limited = settings.model_copy(update={"max_active_runs_per_owner": 1})
    launch(limited, workflow(step_spec()), owner="hostile")
    with pytest.raises(LimitExceeded):
        launch(limited, workflow(step_spec()), owner="hostile")
    assert "rollback" not in ended
