"""Whether a launch is admitted: each budget it counts against, written once in SQL.

A budget is a count the database keeps (:mod:`orchestration.limits.live_counts`) and the setting
that bounds it. :func:`admitted` is every budget's test, which the launch's one statement
puts in its insert; :func:`refused` names the first budget that is full, which the
transaction's admission reads, and :func:`error` words it. No rule is written twice: both
read the same expressions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, case, literal_column, null

from orchestration.core.errors import LimitExceeded
from orchestration.core.settings import Settings
from orchestration.limits import live_counts


@dataclass(frozen=True)
class Budget:
    """One bound a launch counts against: its name, the ``ORCH_`` setting (and field) that
    sets it, and what is counted."""

    name: str
    setting: str
    field: str
    counted: str

    def count(self, owner: Any) -> ColumnElement[int]:
        """The count now (``owner``: a value or a bound parameter)."""
        counted: ColumnElement[int] = live_counts.count_of(
            live_counts.TOTAL if self.name == "all_runs" else owner
        )
        return counted

    @property
    def limit(self) -> Any:
        """The bound parameter of the limit (``a_<name>``)."""
        return bindparam(f"a_{self.name}")


#: In the order they are checked: the deployment's, then the owner's.
BUDGETS = (
    Budget("all_runs", "ORCH_MAX_ACTIVE_RUNS", "max_active_runs", "active runs"),
    Budget(
        "owner_runs", "ORCH_MAX_ACTIVE_RUNS_PER_OWNER", "max_active_runs_per_owner", "active runs"
    ),
)


def admitted(owner: Any) -> ColumnElement[bool]:
    """Every budget has room for one more launch of ``owner``."""
    return and_(*(budget.count(owner) < budget.limit for budget in BUDGETS))


def refused(owner: Any) -> ColumnElement[str | None]:
    """The name of the first budget with no room (``NULL``: admitted)."""
    full: ColumnElement[str | None] = case(
        *(
            (budget.count(owner) >= budget.limit, literal_column(f"'{budget.name}'"))
            for budget in BUDGETS
        ),
        else_=null(),
    )
    return full


def counts(owner: Any) -> list[ColumnElement[int]]:
    """Each budget's count, in :data:`BUDGETS`' order (for the refusal's words)."""
    return [budget.count(owner).label(f"n_{budget.name}") for budget in BUDGETS]


def limits(settings: Settings) -> dict[str, int]:
    """The bound values of :func:`admitted` and :func:`refused`."""
    return {f"a_{budget.name}": getattr(settings, budget.field) for budget in BUDGETS}


def error(name: str, owner: str, count: int, settings: Settings) -> LimitExceeded:
    """The refusal of a launch by the budget ``name``, with its count and its setting."""
    budget = next(budget for budget in BUDGETS if budget.name == name)
    whose = "" if name == "all_runs" else f"owner {owner!r} has "
    limit = getattr(settings, budget.field)
    return LimitExceeded(
        "runs",
        f"{whose}{count} {budget.counted}, the limit of {limit} ({budget.setting}); "
        "retry when some end",
    )
