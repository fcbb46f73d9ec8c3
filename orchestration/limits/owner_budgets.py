"""An operator's own values of an owner's budgets, and an owner's use against them.

The values are rows of ``owner_budgets`` (migration 0017), one per owner, each column ``NULL``
for the setting's; admission reads them in its own statement
(:meth:`orchestration.limits.admission.Budget.limit`), so a change applies to the next launch
with no cache to expire. ``orchestration owners set/show/list`` writes and reads them here;
``/metrics`` and the fleet page read :func:`busiest`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestration.core.errors import ValidationError
from orchestration.core.models import LiveRunCount, OwnerBudget
from orchestration.core.settings import Settings
from orchestration.limits import admission, live_counts

#: The columns an operator sets, by the budget they bound.
COLUMNS = tuple(budget.override for budget in admission.OWNER_BUDGETS if budget.override)
#: The largest value of a column (the others are 32-bit integers).
_MOST = {"max_stored_bytes": 2**62}


@dataclass(frozen=True)
class Use:
    """One budget of one owner: what it counts now, its limit, and the owner's own value
    (``None``: the setting's)."""

    budget: str
    setting: str
    option: str
    used: int
    limit: int
    own: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "setting": self.setting,
            "option": self.option,
            "used": self.used,
            "limit": self.limit,
            "own": self.own,
        }


def set_own(
    session: Session, owner: str, values: dict[str, int | None], now: datetime
) -> dict[str, int | None]:
    """Set the given columns of ``owner``'s own values (``None``: back to the setting's);
    return all its own values. Raises :class:`ValidationError` naming the column for an
    unknown one or a value under 1."""
    for column, value in values.items():
        if column not in COLUMNS:
            raise ValidationError(column, f"is not a budget; one of {', '.join(COLUMNS)}")
        most = _MOST.get(column, 2**31 - 1)
        if value is not None and (isinstance(value, bool) or not 1 <= value <= most):
            raise ValidationError(column, f"must be a whole number from 1 to {most}: {value}")
    row = session.get(OwnerBudget, owner, with_for_update=True)
    if row is None:
        row = OwnerBudget(owner=owner, updated_at=now, **dict.fromkeys(COLUMNS))
        session.add(row)
    for column, value in values.items():
        setattr(row, column, value)
    row.updated_at = now
    session.flush()
    return {column: getattr(row, column) for column in COLUMNS}


def use(session: Session, settings: Settings, owner: str) -> list[Use]:
    """Each of ``owner``'s budgets with its use, limit and own value, read in one statement
    (the same expressions admission reads)."""
    row = session.execute(_uses(owner), admission.limits(settings, admission.OWNER_BUDGETS))
    return _read(row.one())


def _uses(owner: Any) -> Any:
    """The statement of :func:`use` for ``owner`` (a value or a column)."""
    own = [
        select(getattr(OwnerBudget, column)).where(OwnerBudget.owner == owner).scalar_subquery()
        for column in COLUMNS
    ]
    return select(*admission.counts(owner, admission.OWNER_BUDGETS), *own)


def _read(row: Sequence[Any]) -> list[Use]:
    budgets = admission.OWNER_BUDGETS
    owns = dict(zip(COLUMNS, row[2 * len(budgets) :], strict=True))
    return [
        Use(
            budget.name,
            budget.setting,
            budget.option or "",
            int(row[2 * i]),
            int(row[2 * i + 1]),
            owns[budget.override or ""],
        )
        for i, budget in enumerate(budgets)
    ]


def listed(session: Session) -> list[dict[str, Any]]:
    """Every owner with an own value, by name, with its values (``None``: the setting's)."""
    rows = session.scalars(select(OwnerBudget).order_by(OwnerBudget.owner))
    return [
        {
            "owner": row.owner,
            **{column: getattr(row, column) for column in COLUMNS},
            "updated_at": row.updated_at,
        }
        for row in rows
    ]


def busiest(session: Session, settings: Settings, most: int) -> list[tuple[str, list[Use]]]:
    """The ``most`` owners with the most live runs (by name among equals), each with its
    budgets' use: what ``/metrics`` and the fleet page show, so that their labels are
    bounded whatever the number of owners. One statement: the ranking reads the live-run
    counts' rows, then each owner's budgets are read as :func:`use` reads them."""
    if most <= 0:
        return []
    live = func.sum(LiveRunCount.live)
    top = (
        select(LiveRunCount.owner.label("owner"), live.label("live"))
        .where(LiveRunCount.owner != live_counts.TOTAL)
        .group_by(LiveRunCount.owner)
        .having(live > 0)
        .order_by(live.desc(), LiveRunCount.owner)
        .limit(most)
        .subquery("top_owners")
    )
    statement = (
        _uses(top.c.owner)
        .add_columns(top.c.owner)
        .select_from(top)
        .order_by(top.c.live.desc(), top.c.owner)
    )
    rows = session.execute(statement, admission.limits(settings, admission.OWNER_BUDGETS))
    return [(str(row[-1]), _read(row[:-1])) for row in rows]
