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

from sqlalchemy import CTE, Executable, Select, exists, literal, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import UpdateBase

#: ``session.info`` key: whether this session may send pieces together (set by
#: ``db.session_scope`` from ``ORCH_SINGLE_STATEMENT``; PostgreSQL only).
TOGETHER = "orch_together"


@dataclass(frozen=True, eq=False)
class Piece:
    """One statement of a decision: an ``INSERT``/``UPDATE``/``DELETE … RETURNING`` or a
    ``SELECT`` of at most one row; ``after`` names the piece whose row it needs."""

    name: str
    statement: UpdateBase | Select[Any]
    after: str | None = None


#: A piece's row by column name (``None``: it returned nothing, or did not run).
Returned = dict[str, Any]


def together(session: Session) -> bool:
    """Whether :func:`send` sends this session's pieces as one statement."""
    return bool(session.info.get(TOGETHER, session.get_bind().dialect.name == "postgresql"))


def send(
    session: Session, pieces: Sequence[Piece], params: Mapping[str, Any]
) -> dict[str, Returned | None]:
    """Run ``pieces`` with ``params`` (shared by all of them); each piece's row."""
    if len(pieces) > 1 and together(session):
        row = session.execute(_composed(tuple(pieces)), dict(params)).one()
        return _split(tuple(pieces), row._mapping)
    rows: dict[str, Returned | None] = {}
    for piece in pieces:
        if piece.after is not None and rows[piece.after] is None:
            rows[piece.name] = None
            continue
        found = session.execute(piece.statement, dict(params)).first()
        rows[piece.name] = None if found is None else dict(found._mapping)
    return rows


def can_autocommit(session_together: bool, pieces: Sequence[Piece]) -> bool:
    """Whether ``pieces`` may be sent with no transaction around them: only as one
    statement (a single piece is one statement in either form)."""
    return session_together or len(pieces) == 1


@functools.lru_cache(maxsize=64)
def _composed(pieces: tuple[Piece, ...]) -> Executable:
    """The pieces as one statement of CTEs; one row: each piece's columns (``NAME__COLUMN``)
    and whether it returned a row (``NAME__``). Built once per tuple of pieces."""
    ctes: dict[str, CTE] = {}
    for piece in pieces:
        statement: Any = piece.statement
        if piece.after is not None:
            statement = statement.where(exists(select(1).select_from(ctes[piece.after])))
        ctes[piece.name] = statement.cte(piece.name)
    columns = []
    for name, cte in ctes.items():
        columns.append(exists(select(1).select_from(cte)).label(f"{name}__"))
        columns.extend(
            select(column).scalar_subquery().label(f"{name}__{column.key}") for column in cte.c
        )
    # PostgreSQL runs a data-modifying CTE to completion though nothing reads it; every
    # CTE is read here anyway.
    return select(*columns).add_cte(*ctes.values()) if columns else select(literal(1))


def _split(pieces: tuple[Piece, ...], row: Mapping[str, Any]) -> dict[str, Returned | None]:
    rows: dict[str, Returned | None] = {}
    for piece in pieces:
        if not row[f"{piece.name}__"]:
            rows[piece.name] = None
            continue
        prefix = f"{piece.name}__"
        rows[piece.name] = {
            key[len(prefix) :]: value
            for key, value in row.items()
            if key.startswith(prefix) and key != prefix
        }
    return rows
