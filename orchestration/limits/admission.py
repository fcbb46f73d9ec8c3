"""Whether a launch is admitted: each budget it counts against, written once in SQL.

A budget is a count the database keeps or reads (:mod:`orchestration.limits.live_counts`,
:mod:`orchestration.limits.owner_use`) and the limit that bounds it: the deployment's setting,
or for an owner's budget the owner's own value when an operator set one (``owner_budgets``,
read by the same statement, so no read-then-decide race). :func:`admitted` is every budget's
test, which the launch's one statement puts in its insert; :func:`refused` names the first
budget that is full, which the transaction's admission reads, and :func:`error` words it. No
rule is written twice: both read the same expressions. Registration
(:data:`DEFINITIONS`) and a branching step's branch runs (:func:`refused` with ``more``)
read them too.

:func:`check`, the transaction's admission, first takes the owner's lock (:func:`serialised`),
so that two writes of one owner checked in transactions (registrations, schedules, stored
artifacts, branch runs) take turns and the second counts what the first wrote. A launch's and a
start claim's one statement read the counts in their snapshot, without a lock: see
``docs/security.md`` for the bound that leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, bindparam, case, func, null, select
from sqlalchemy.orm import Session

from orchestration.core.db import constant, on_postgresql
from orchestration.core.errors import LimitExceeded
from orchestration.core.models import OwnerBudget
from orchestration.core.settings import Settings
from orchestration.limits import live_counts, owner_use


@dataclass(frozen=True)
class Budget:
    """One bound a launch (or a registration) counts against: its name, the ``ORCH_``
    setting (and field) that sets it, what is counted, the ``owner_budgets`` column of an
    owner's own value (``None``: the deployment's, not an owner's), the field a refusal
    names and what to do about it."""

    name: str
    setting: str
    field: str
    counted: str
    counter: Callable[[Any], ColumnElement[int]]
    override: str | None
    subject: str
    remedy: str

    def count(self, owner: Any) -> ColumnElement[int]:
        """The count now (``owner``: a value or a bound parameter)."""
        return self.counter(owner)

    def limit(self, owner: Any) -> ColumnElement[int]:
        """The limit: the owner's own value, else the bound setting (``a_<name>``)."""
        setting: ColumnElement[int] = bindparam(f"a_{self.name}")
        if self.override is None:
            return setting
        own = select(getattr(OwnerBudget, self.override)).where(OwnerBudget.owner == owner)
        limit: ColumnElement[int] = func.coalesce(own.scalar_subquery(), setting)
        return limit

    @property
    def option(self) -> str | None:
        """The ``orchestration owners set`` option of the owner's own value."""
        return None if self.override is None else "--" + self.override.replace("_", "-")


ALL_RUNS = Budget(
    "all_runs",
    "ORCH_MAX_ACTIVE_RUNS",
    "max_active_runs",
    "active runs (branch runs included)",
    lambda _: live_counts.count_of(live_counts.TOTAL),
    None,
    "runs",
    "retry when some end",
)
OWNER_RUNS = Budget(
    "owner_runs",
    "ORCH_MAX_ACTIVE_RUNS_PER_OWNER",
    "max_active_runs_per_owner",
    "active runs (branch runs included)",
    live_counts.count_of,
    "max_active_runs",
    "runs",
    "retry when some end",
)
DEFINITIONS = Budget(
    "owner_definitions",
    "ORCH_MAX_DEFINITIONS_PER_OWNER",
    "max_definitions_per_owner",
    "registered definition versions",
    owner_use.definitions,
    "max_definitions",
    "definitions",
    "an operator may raise it",
)
LIVE_TURNS = Budget(
    "owner_live_turns",
    "ORCH_MAX_LIVE_TURNS_PER_OWNER",
    "max_live_turns_per_owner",
    "live provider turns",
    owner_use.live_turns,
    "max_live_turns",
    "turns",
    "retry when some end",
)
STORED_BYTES = Budget(
    "owner_stored_bytes",
    "ORCH_MAX_STORED_BYTES_PER_OWNER",
    "max_stored_bytes_per_owner",
    "stored bytes (the outputs and artifacts of live and kept runs)",
    owner_use.stored_bytes,
    "max_stored_bytes",
    "stored_bytes",
    "prune ended runs (orchestration prune) or ask an operator to raise it",
)

#: What a launch counts against, in the order they are checked: the deployment's, then the
#: owner's.
BUDGETS: tuple[Budget, ...] = (ALL_RUNS, OWNER_RUNS, LIVE_TURNS, STORED_BYTES)
#: Every budget an owner has, as ``owners show``, ``/metrics`` and the fleet page list them.
OWNER_BUDGETS: tuple[Budget, ...] = (OWNER_RUNS, LIVE_TURNS, DEFINITIONS, STORED_BYTES)


def admitted(owner: Any) -> ColumnElement[bool]:
    """Every budget has room for one more launch of ``owner``."""
    return refused(owner).is_(None)


def full(budget: Budget, owner: Any, more: Any = 1) -> ColumnElement[bool]:
    """``budget`` has no room for ``more`` of ``owner``."""
    # A whole number is written into the statement, not bound: a statement built once (the
    # start claim's) is the same for every execution.
    added = constant(more) if isinstance(more, int) else more
    over: ColumnElement[bool] = budget.count(owner) + added > budget.limit(owner)
    return over


def refused(
    owner: Any, budgets: Sequence[Budget] = BUDGETS, more: Any = 1
) -> ColumnElement[str | None]:
    """The name of the first of ``budgets`` with no room for ``more`` (``NULL``: admitted)."""
    named: ColumnElement[str | None] = case(
        *((full(budget, owner, more), constant(budget.name)) for budget in budgets),
        else_=null(),
    )
    return named


def counts(owner: Any, budgets: Sequence[Budget] = BUDGETS) -> list[ColumnElement[int]]:
    """Each budget's count and limit, in ``budgets``' order (for the refusal's words)."""
    return [
        column
        for budget in budgets
        for column in (
            budget.count(owner).label(f"n_{budget.name}"),
            budget.limit(owner).label(f"l_{budget.name}"),
        )
    ]


def limits(settings: Settings, budgets: Sequence[Budget] = BUDGETS) -> dict[str, int]:
    """The bound settings of :func:`admitted`, :func:`refused` and :func:`counts`."""
    return {f"a_{budget.name}": getattr(settings, budget.field) for budget in budgets}


def error(
    name: str,
    owner: str,
    counted: Sequence[int],
    budgets: Sequence[Budget] = BUDGETS,
    why: str = "",
) -> LimitExceeded:
    """The refusal by the budget ``name``; ``counted`` is what :func:`counts` read."""
    at = next(i for i, budget in enumerate(budgets) if budget.name == name)
    return exceeded(budgets[at], owner, counted[2 * at], counted[2 * at + 1], why)


#: The first key of an owner's admission lock (PostgreSQL advisory locks are two numbers):
#: "ORCH" in ASCII, apart from any other lock of the database's users.
LOCK_SPACE = 0x4F524348


def serialised(session: Session, owner: str) -> None:
    """Wait for ``owner``'s admission lock, held to the end of the transaction (PostgreSQL).
    Each statement after it reads a snapshot taken after the lock's last holder committed.
    SQLite has one writer at a time: a transaction that read before another wrote fails at
    its own write instead of counting wrong."""
    if on_postgresql(session):
        session.execute(select(func.pg_advisory_xact_lock(LOCK_SPACE, func.hashtext(owner))))


def check(
    session: Session,
    settings: Settings,
    owner: str,
    budgets: Sequence[Budget],
    more: int = 1,
    why: str = "",
) -> None:
    """Raise the refusal of the first of ``budgets`` with no room for ``more`` of ``owner``,
    read in one statement with the owner's own values, under the owner's lock."""
    serialised(session, owner)
    found, *counted = session.execute(
        select(refused(owner, budgets, more), *counts(owner, budgets)),
        limits(settings, budgets),
    ).one()
    if found is not None:
        raise error(found, owner, counted, budgets, why)


def exceeded(budget: Budget, owner: str, count: int, limit: int, why: str = "") -> LimitExceeded:
    """The refusal by ``budget``, at ``count`` of ``limit``, naming its setting."""
    whose = "" if budget.override is None else f"owner {owner!r} has "
    own = "" if budget.option is None else f", or the owner's own {budget.option}"
    return LimitExceeded(
        budget.subject,
        f"{why}{whose}{count} {budget.counted}, the limit of {limit} ({budget.setting}{own}); "
        f"{budget.remedy}",
    )
