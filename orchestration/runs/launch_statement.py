"""A launch as one statement: the admission, the run's insert and its steps' insert.

Most launches name a new request id, hold no concurrency key and fit under the budgets. For
those the rows :mod:`.new_rows` built go in as one statement of data-modifying CTEs, sent
in autocommit when the deployment sends pieces together
(:func:`orchestration.core.pieces.one_statement`): the run's insert is made only where
:func:`orchestration.limits.admission.admitted` holds and does
nothing on a taken request id (``ON CONFLICT DO NOTHING``) or for a suspended owner; the
steps are selected from it,
so they exist exactly when the run does, and the database journals the run. The statement
also returns the run the request id named before it began (a replay is answered from it)
and the new run's health. One that wrote nothing and found nothing (a budget full, a
suspended owner, a concurrent launch of the same id) leaves the launch to the transaction,
which says which.
The steps go in as one array for each column in which they differ (``new_runs.PER_STEP``)
and one value for the rest, so the statement is the same whatever the run's length
(``docs/architecture.md``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, case, exists, false, func, select, true
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from orchestration.core import health, pieces
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import Health
from orchestration.limits import admission, suspensions
from orchestration.runs.new_rows import PER_STEP, NewRun

_RUNS = cast(Table, Run.__table__)
#: What the run's insert returns: its id and the columns its health is judged on.
_JUDGED = (
    "id",
    "status",
    "concurrency",
    "heartbeat_at",
    "created_at",
    "cancel_requested_at",
    "park_reason",
    "parked_since",
    "waiting_until",
)
_STEPS = cast(Table, Step.__table__)


def fits(settings: Settings, request: NewRun) -> bool:
    """Whether ``request`` may be launched as one statement: on PostgreSQL, a new run (not a
    rerun) with no concurrency key (whose holder it may end in the same
    transaction)."""
    return (
        request.concurrency_key is None and request.reuse is None and pieces.one_statement(settings)
    )


def set_columns(row: Run | Step) -> dict[str, Any]:
    """The columns a new row object was given, by column name (what the ORM would insert);
    every step of a launch is given the same ones."""
    given = vars(row)
    columns = row.__table__.columns
    return {column.key: given[column.key] for column in columns if column.key in given}


@dataclass(frozen=True)
class Outcome:
    """What the one statement did: wrote the run (``made``), or found the owner's request id
    taken before it began (``found``, with that run's ``fingerprint``), or neither (a limit,
    or a concurrent launch of the same id: the transaction decides)."""

    made: bool
    found: str | None
    fingerprint: str | None
    #: The health of the run it made, judged by the statement (``health.expression``).
    health: Health | None = None


def write(
    session: Session,
    settings: Settings,
    run: dict[str, Any],
    steps: Sequence[dict[str, Any]],
) -> Outcome:
    """Insert the run and its steps if the run is admitted (see the module docstring), in one
    statement (the database journals the run). Raises ``ValueError`` for steps that differ
    in a column outside ``new_runs.PER_STEP``, which one value could not write."""
    first = steps[0]
    varying = tuple(name for name in first if name in PER_STEP)
    shared = {name: value for name, value in first.items() if name not in PER_STEP}
    differ = {name for step in steps[1:] for name, value in shared.items() if step[name] != value}
    if differ:
        raise ValueError(f"new steps differ in {sorted(differ)}, outside new_runs.PER_STEP")
    statement = _statement(tuple(run), varying, tuple(shared))
    params: dict[str, Any] = {f"r_{name}": value for name, value in run.items()}
    params.update({f"s_{name}": [step[name] for step in steps] for name in varying})
    params.update({f"s_{name}": value for name, value in shared.items()})
    params.update(admission.limits(settings))
    params.update(health.params(settings, run["created_at"]))
    made, found, fingerprint, judged = session.execute(statement, params).one()
    return Outcome(bool(made), found, fingerprint, None if judged is None else Health(judged))


@functools.lru_cache(maxsize=8)
def _statement(
    run_columns: tuple[str, ...], step_columns: tuple[str, ...], shared: tuple[str, ...]
) -> Any:
    """The statement for rows given these columns (the steps' ``step_columns`` one array
    each, their ``shared`` ones one value each), built once per shape."""
    owner = bindparam("r_owner", type_=_RUNS.c.owner.type)
    # The run the owner's request id names, looked up once through ``uq_runs_owner_request``.
    # It reads the statement's snapshot, taken before its inserts: it finds a run only when
    # the request id was taken before this launch, which is then a replay (or a conflict)
    # answered without a transaction.
    prior = (
        select(_RUNS.c.id, _RUNS.c.fingerprint)
        .where(
            _RUNS.c.owner == owner,
            _RUNS.c.request_id == bindparam("r_request_id", type_=_RUNS.c.request_id.type),
        )
        .cte("prior")
    )
    # A taken request id is looked up first and the counts only when it is free (``CASE``
    # evaluates its branch lazily): a replay reads no count. A suspended owner's run is not
    # made, in this statement (``limits/suspensions.py`` says why that has no race).
    admitted = select(
        *(bindparam(f"r_{name}", type_=_RUNS.c[name].type) for name in run_columns)
    ).where(
        case(
            (exists(select(1).select_from(prior)), false()),
            else_=admission.admitted(owner),
        ),
        suspensions.admits(owner),
    )
    made = (
        postgresql.insert(_RUNS)
        .from_select(list(run_columns), admitted)
        .on_conflict_do_nothing(constraint="uq_runs_owner_request")
        .returning(*(_RUNS.c[name] for name in _JUDGED))
        .cte("made")
    )
    given = (
        func.unnest(
            *(
                bindparam(f"s_{name}", type_=postgresql.ARRAY(_STEPS.c[name].type))
                for name in step_columns
            )
        )
        .table_valued(*step_columns)
        .render_derived()
    )
    once = [bindparam(f"s_{name}", type_=_STEPS.c[name].type) for name in shared]
    step_rows = (
        _STEPS.insert()
        .from_select(
            [*step_columns, *shared],
            select(*given.c, *once).select_from(made).join(given, true()),
        )
        .cte("step_rows")
    )
    return select(
        exists(select(1).select_from(made)).label("made"),
        select(prior.c.id).scalar_subquery().label("found"),
        select(prior.c.fingerprint).scalar_subquery().label("fingerprint"),
        select(health.expression(made.c)).scalar_subquery().label("health"),
    ).add_cte(prior, made, step_rows)
