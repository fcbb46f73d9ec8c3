"""The statements an execution sends on every poll and every start stay short enough for
psycopg to cache their parse.

psycopg turns each ``%(name)s`` query into PostgreSQL's ``$n`` form and caches the result by
the query's text, but only for a query of at most ``MAX_CACHED_STATEMENT_LENGTH`` bytes and
``MAX_CACHED_STATEMENT_PARAMS`` parameters: a longer one is parsed again at every execution
(its regular expression over the whole text, a fraction of a millisecond each time). These
are compiled here as SQLAlchemy renders them for psycopg, the casts of every bound value
included, with no database.
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH, MAX_CACHED_STATEMENT_PARAMS
from sqlalchemy.dialects.postgresql import psycopg

from orchestration.core import pieces
from orchestration.core.states import RunStatus, StepStatus
from orchestration.execution import fence, rows
from orchestration.runs import effects, transitions

_DIALECT = psycopg.dialect()


def _sql(statement: Any) -> tuple[str, int]:
    compiled = statement.compile(dialect=_DIALECT)
    return str(compiled), len(compiled.params)


def _sent(parts: tuple[pieces.Piece, ...], durable: bool = True) -> Any:
    """The one statement :func:`pieces.send` sends for ``parts`` on PostgreSQL."""
    return pieces._composed(parts, durable).statement


#: What every poll sends (the fence and the stamp, not durable), what a plain task's first
#: execution sends (the fence carrying the claim), the entry in a transaction (judging the
#: refusal), the run's lock with its step, an inline checkpoint with its outbox row, and a
#: step completed with its run moved on.
HOT = {
    "poll": lambda: _sent(fence.ENTER_UNJUDGED, durable=False),
    "entry": lambda: _sent(fence.ENTER),
    "start": lambda: _sent(fence.ENTER_AND_CLAIM),
    "lock": lambda: _sent(rows._lock((RunStatus.PARKED.value, RunStatus.RUNNING.value))),
    "checkpoint": lambda: _sent(effects._captured("postgresql")),
    "complete": lambda: _sent(
        transitions._move_pieces(
            StepStatus.COMPLETED,
            ("status", "cause", "updated_at", "output", "finished_at", "next_poll_at"),
            None,
            ("updated_at", "current_step"),
        )
    ),
}


@pytest.mark.parametrize("name", sorted(HOT))
def test_a_hot_statement_is_short_enough_for_psycopg_to_cache_its_parse(name: str) -> None:
    sql, params = _sql(HOT[name]())
    assert len(sql.encode()) <= MAX_CACHED_STATEMENT_LENGTH, (name, len(sql.encode()))
    assert params <= MAX_CACHED_STATEMENT_PARAMS, (name, params)


def test_the_engine_s_constants_are_written_into_the_statement_not_bound() -> None:
    """A status, a JSON key or a whole number of the engine's own is not a placeholder: the
    poll binds only what changes between executions."""
    sql, _ = _sql(_sent(fence.ENTER, durable=False))
    assert "%(status_" not in sql and "%(param_" not in sql and "%(turn_stop_" not in sql
    assert "turn_stop ->> 'key')" in sql
