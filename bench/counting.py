"""Counting what one piece of engine code sends to the database, transaction by transaction.

A :class:`Counts` listens on one SQLAlchemy engine (``before_cursor_execute``, ``begin``,
``commit`` and the pool's ``checkout``) and, inside :meth:`Counts.counting`, groups the
statements by the transaction they ran in. The scripted provider keeps its turns in the same
database (the same engine on PostgreSQL), so a transaction whose statements all touch its
tables (``scripted_*``) is the provider's, counted apart: a real provider answers over HTTP.

Round trips = statements + the ``BEGIN`` and ``COMMIT`` the driver sent (none around an
autocommit read) + pings, provider's included (they are on the same connection pool). A ping is
the ``SELECT 1`` on checkout: on every checkout for an engine built with ``pool_pre_ping`` (the
baseline), on a connection idle for ``orchestration.core.db.PING_IDLE_SECONDS`` or more otherwise.

Only SQLAlchemy and ``orchestration.core.db.get_engine`` are used, so the same counter runs against
an older engine (the baseline in ``bench/baseline/``).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from sqlalchemy import event

from bench import stats
from orchestration.core.db import get_engine

try:
    from orchestration.core.db import PING_IDLE_SECONDS as _PING_IDLE
except ImportError:  # an engine from before the idle-only ping (the baseline) pings always
    _PING_IDLE = 0.0

#: Tables of the scripted provider: its statements are the provider's, not the engine's.
PROVIDER_MARK = "scripted_"


#: Transaction control inside a transaction (the provider's ``begin_nested``): it belongs to
#: whoever owns the transaction.
_CONTROL = ("SAVEPOINT", "RELEASE", "ROLLBACK")


def _provider(statement: str) -> bool:
    return PROVIDER_MARK in statement


def _control(statement: str) -> bool:
    return statement.lstrip().upper().startswith(_CONTROL)


def _provider_txn(txn: list[str]) -> bool:
    """Only the provider's statements (and savepoints around them)."""
    return any(map(_provider, txn)) and all(_provider(s) or _control(s) for s in txn)


def _autocommit(connection: Any) -> bool:
    return bool(connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT")


class Counts:
    """SQLAlchemy events on one engine, counted while :meth:`counting` is open."""

    def __init__(self, url: str) -> None:
        self.engine = get_engine(url)
        self.transactions: list[list[str]] = []
        self.outside: list[str] = []
        self.commits = 0
        self.begins = 0
        self.checkouts = 0
        self.pings = 0
        self.active = False
        event.listen(self.engine, "before_cursor_execute", self._statement)
        event.listen(self.engine, "commit", self._commit)
        event.listen(self.engine, "begin", self._begin)
        event.listen(self.engine.pool, "checkout", self._checkout)

    def _statement(self, connection: Any, _cur: Any, statement: str, *_: Any) -> None:
        if self.active:
            inside = self.transactions and not _autocommit(connection)
            (self.transactions[-1] if inside else self.outside).append(statement)

    def _commit(self, connection: Any) -> None:
        self.commits += self.active and not _autocommit(connection)

    def _begin(self, connection: Any) -> None:
        # An autocommit connection's "transaction" sends no BEGIN and no COMMIT: its
        # statements commit one by one, and count as outside any transaction.
        if self.active and not _autocommit(connection):
            self.transactions.append([])
            self.begins += 1

    def _checkout(self, _dbapi: Any, record: Any, _proxy: Any) -> None:
        if not self.active:
            return
        self.checkouts += 1
        idle_since = record.info.get("checked_in")
        self.pings += bool(
            self.engine.pool._pre_ping
            or (idle_since is not None and time.monotonic() - idle_since >= _PING_IDLE)
        )

    @contextlib.contextmanager
    def counting(self) -> Iterator[dict[str, Any]]:
        """Count what runs inside; the yielded dict is filled in when the block ends."""
        self.transactions, self.outside = [], []
        self.commits = self.begins = self.checkouts = self.pings = 0
        result: dict[str, Any] = {}
        self.active = True
        started = time.perf_counter()
        try:
            yield result
        finally:
            self.active = False
            result["seconds"] = time.perf_counter() - started
            result.update(
                summary(
                    self.transactions,
                    self.outside,
                    commits=self.commits,
                    begins=self.begins,
                    checkouts=self.checkouts,
                    pings=self.pings,
                )
            )


def summary(
    transactions: list[list[str]],
    outside: list[str],
    *,
    commits: int,
    begins: int,
    checkouts: int,
    pings: int,
) -> dict[str, Any]:
    """The counts of one block: engine statements and transactions, provider's apart."""
    everything = [s for txn in transactions for s in txn] + outside
    engine_txns = [txn for txn in transactions if not _provider_txn(txn)]
    engine_sql = [s for txn in [*engine_txns, outside] for s in txn if not _provider(s)]
    kinds = Counter(s.split(None, 1)[0].upper() for s in engine_sql)
    return {
        "statements": len(engine_sql),
        "provider_statements": len(everything) - len(engine_sql),
        "by_kind": dict(kinds),
        "step_selects": sum(1 for s in engine_sql if "FROM steps" in s),
        "transactions": len(engine_txns),
        "provider_transactions": len(transactions) - len(engine_txns),
        "statements_per_transaction": [
            sum(1 for s in txn if not _provider(s)) for txn in engine_txns
        ],
        "commits": commits,
        "checkouts": checkouts,
        "pings": pings,
        "round_trips": len(everything) + begins + commits + pings,
    }


def add(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Several blocks' counts summed (the executions of one step)."""
    keys = ("statements", "provider_statements", "step_selects", "transactions")
    total: dict[str, Any] = {key: sum(s[key] for s in samples) for key in keys}
    total.update(
        provider_transactions=sum(s["provider_transactions"] for s in samples),
        round_trips=sum(s["round_trips"] for s in samples),
        seconds=sum(s["seconds"] for s in samples),
        statements_per_transaction=[n for s in samples for n in s["statements_per_transaction"]],
        executions=len(samples),
        by_kind=dict(sum((Counter(s["by_kind"]) for s in samples), Counter())),
    )
    return total


#: What a phase's summary quotes: medians over its executions, and the largest seen.
_KEYS = (
    "statements",
    "provider_statements",
    "step_selects",
    "transactions",
    "provider_transactions",
    "commits",
    "checkouts",
    "pings",
    "round_trips",
    "seconds",
)


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per execution phase (``start``, ``poll``, ``finish``): medians, and the largest."""
    out: dict[str, Any] = {}
    for phase in ("start", "poll", "finish"):
        rows = [s for s in samples if s["phase"] == phase]
        if not rows:
            continue
        out[phase] = {key: stats.median([float(r[key]) for r in rows]) for key in _KEYS}
        out[phase]["max"] = {
            key: max(float(r[key]) for r in rows) for key in ("statements", "transactions")
        }
        out[phase]["by_kind"] = rows[-1]["by_kind"]
        out[phase]["statements_per_transaction"] = rows[-1]["statements_per_transaction"]
        out[phase]["samples"] = len(rows)
    return out


def summarise_steps(steps: list[dict[str, Any]], links: int) -> dict[str, Any]:
    """Per-step medians and maxima over a run's steps, all of them and by kind of link."""

    def over(rows: list[dict[str, Any]]) -> dict[str, Any]:
        keys = ("executions", "statements", "transactions", "provider_statements")
        return {
            "steps": len(rows),
            **{key: stats.median([float(r[key]) for r in rows]) for key in keys},
            "round_trips": stats.median([float(r["round_trips"]) for r in rows]),
            "seconds": stats.median([r["seconds"] for r in rows]),
            "max": {key: max(float(r[key]) for r in rows) for key in keys},
            "mean": {key: sum(float(r[key]) for r in rows) / len(rows) for key in keys},
        }

    inside = [s for s in steps[:-1] if not s["segment_end"]]
    ends = [s for s in steps[:-1] if s["segment_end"]]
    return {
        "links": links,
        "all": over(steps),
        "inside_segment": over(inside) if inside else None,
        "segment_end": over(ends) if ends else None,
        "last": over(steps[-1:]),
        "by_kind_first_step": steps[0]["by_kind"],
        "statements_per_transaction_first_step": steps[0]["statements_per_transaction"],
    }
