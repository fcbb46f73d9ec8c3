"""How a decision's statements are sent: as one statement, or as a sequence in a transaction.

A decision that writes more than one row (fence a step and stamp its run; claim a start;
admit a launch and insert its rows) is written once, as :class:`Piece` s: each piece is one
statement that writes or reads at most one row and returns it, and may run only when an
earlier piece returned its row. :func:`send` is the only place that chooses how they go:

* **together** (PostgreSQL): one statement, each piece a data-modifying CTE, a dependent
  piece conditional on ``EXISTS`` of the one it follows. One statement is atomic by itself,
  so it may be sent in autocommit: one round trip.
* **in sequence** (SQLite, or PostgreSQL with ``ORCH_SINGLE_STATEMENT=false``): each piece
  in turn, in the caller's transaction, a dependent piece skipped when the one it follows
  returned nothing.

The two forms write the same rows and return the same values: every piece's condition is in
its own SQL, and no piece reads a row an earlier one wrote except through that condition.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    CTE,
    Connection,
    Executable,
    Select,
    exists,
    func,
    literal_column,
    select,
    true,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import UpdateBase

from orchestration.core.db import TOGETHER, constant, on_postgresql, postgresql_url
from orchestration.core.settings import Settings


@dataclass(frozen=True, eq=False)
class Piece:
    """One statement of a decision: an ``INSERT``/``UPDATE``/``DELETE … RETURNING`` or a
    ``SELECT`` of at most one row; ``after`` names the piece whose row it needs.

    A dependent ``INSERT`` is given as its ``INSERT … RETURNING`` with ``source``, the
    columns and the ``SELECT`` of its row: the condition of the piece it follows goes into
    that ``SELECT`` (an ``INSERT`` has no ``WHERE`` of its own)."""

    name: str
    statement: UpdateBase | Select[Any]
    after: str | None = None
    source: tuple[tuple[str, ...], Select[Any]] | None = None

    def written(self, condition: Any = None) -> Any:
        """The piece's statement, run only where ``condition`` holds (``None``: always)."""
        statement: Any = self.statement
        if self.source is not None:
            columns, row = self.source
            return statement.from_select(
                list(columns), row if condition is None else row.where(condition)
            )
        return statement if condition is None else statement.where(condition)


#: A piece's row by column name (``None``: it returned nothing, or did not run).
Returned = dict[str, Any]


def together(session: Session | Connection) -> bool:
    """Whether :func:`send` sends this session's pieces as one statement: on PostgreSQL,
    unless the session was opened with ``ORCH_SINGLE_STATEMENT`` off (a provider's store,
    sent on a connection of its own, has no such setting)."""
    if isinstance(session, Connection):
        return bool(session.dialect.name == "postgresql")
    return on_postgresql(session) and bool(session.info.get(TOGETHER, True))


def send(
    session: Session | Connection,
    pieces: Sequence[Piece],
    params: Mapping[str, Any],
    *,
    durable: bool = True,
) -> dict[str, Returned | None]:
    """Run ``pieces`` with ``params`` (shared by all of them); each piece's row.

    Not ``durable``: sent together in autocommit, the statement commits without waiting for
    its WAL to reach the disk (``synchronous_commit`` off for its own implicit transaction):
    a server crash can lose it, never a later durable commit. Only for writes whose loss the
    engine recovers by design (a poll's fence and stamp); a sequence is always durable."""
    if len(pieces) > 1 and together(session):
        composed = _composed(tuple(pieces), durable)
        row = session.execute(composed.statement, dict(params)).one()
        return _split(composed.layout, tuple(row))
    rows: dict[str, Returned | None] = {}
    for piece in pieces:
        if piece.after is not None and rows[piece.after] is None:
            rows[piece.name] = None
            continue
        found = session.execute(_alone(piece), dict(params)).first()
        rows[piece.name] = None if found is None else dict(found._mapping)
    return rows


@functools.lru_cache(maxsize=64)
def _alone(piece: Piece) -> Any:
    """The piece's statement as a sequence sends it, built once per piece."""
    return piece.written()


def one_statement(settings: Settings) -> bool:
    """Whether sessions of ``settings``' database send pieces together, as one statement
    that may go with no transaction around it (PostgreSQL, ``ORCH_SINGLE_STATEMENT``)."""
    return settings.single_statement and postgresql_url(settings.database_url)


@dataclass(frozen=True)
class _Composed:
    """Pieces as one statement, and where each piece's values are in its one row."""

    statement: Executable
    #: Each piece's name and its columns' keys, in the row's order: a piece's values follow
    #: the flag saying whether it returned a row.
    layout: tuple[tuple[str, tuple[str, ...]], ...]


@functools.lru_cache(maxsize=64)
def _composed(pieces: tuple[Piece, ...], durable: bool) -> _Composed:
    """The pieces as one statement of CTEs; one row: for each piece, whether it returned a
    row, then its columns. Built once per tuple of pieces.

    Each CTE returns at most one row, so the row is every CTE joined ``ON true`` to one
    constant row: a column is a plain reference, not a sub-select of its own (a run's
    columns and its step's, read that way, cost a subplan each). The values are read by
    position, so only each piece's flag is labelled (``pN__``), no column: the statement
    stays short enough for psycopg to cache its parse (4 KiB;
    ``tests/unit/test_statement_lengths.py``)."""
    ctes: dict[str, CTE] = {}
    for at, piece in enumerate(pieces):
        condition = None
        if piece.after is not None:
            condition = exists(select(1).select_from(ctes[piece.after]))
        statement = piece.written(condition)
        # Named by position (``p0``, ``p1``…): a name is written once per column read.
        ctes[piece.name] = statement.cte(f"p{at}")
    joined: Any = select(literal_column("1").label("one")).subquery("one")
    columns: list[Any] = []
    layout = []
    for name, cte in ctes.items():
        joined = joined.outerjoin(cte, true())
        columns.append(exists(select(1).select_from(cte)).label(f"{cte.name}__"))
        columns.extend(cte.c)
        layout.append((name, tuple(column.key for column in cte.c)))
    if not durable:
        columns.append(func.set_config(constant("synchronous_commit"), constant("off"), true()))
    statement = select(*columns).select_from(joined).add_cte(*ctes.values())
    return _Composed(statement, tuple(layout))


def _split(
    layout: tuple[tuple[str, tuple[str, ...]], ...], row: Sequence[Any]
) -> dict[str, Returned | None]:
    """Each piece's row out of the one row :func:`_composed`'s statement returned."""
    rows: dict[str, Returned | None] = {}
    at = 0
    for name, keys in layout:
        returned, values = row[at], row[at + 1 : at + 1 + len(keys)]
        at += 1 + len(keys)
        rows[name] = dict(zip(keys, values, strict=True)) if returned else None
    return rows
