"""A poll's entry on PostgreSQL: fence and stamp in one statement, with no transaction around it.

Most executions are polls of a running turn on a running run. For those the entry is two
updates (``entry``): the fence on the step and the stamp on the run. PostgreSQL runs both in
one statement (data-modifying CTEs), and one statement is atomic by itself, so it needs no
``BEGIN`` and ``COMMIT``: one round trip instead of four. The stamp is conditional on the
fence (``EXISTS (SELECT 1 FROM fenced)``), so a duplicate delivery writes nothing.

The statement only fences a step that is running with a provider turn. What it cannot take
is left to the full entry, in a transaction: no row (a start, a parked or retrying step, a
duplicate) goes on with the message's tick; a row that was fenced but not stamped (the run is
not plainly running: a cancel requested, parked, waiting) goes on with the tick it fenced.
SQLite has no data-modifying CTEs: there every execution takes the full entry.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Integer, Table, bindparam, exists, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from orchestration import deadlines, specs
from orchestration.db import normalize_url
from orchestration.execution.entry import Entry, Phase, StepRow
from orchestration.followups import Done, Transact
from orchestration.models import Run, Step
from orchestration.settings import Settings
from orchestration.states import RunStatus, StepStatus

_STEPS: Table = Step.__table__  # type: ignore[assignment]
_RUNS: Table = Run.__table__  # type: ignore[assignment]

_FENCED = (
    update(_STEPS)
    .where(
        _STEPS.c.run_id == bindparam("b_run"),
        _STEPS.c.index == bindparam("b_index"),
        _STEPS.c.polls == bindparam("b_tick"),
        _STEPS.c.status == StepStatus.RUNNING.value,
        _STEPS.c.provider_run_id.is_not(None),
    )
    .values(
        polls=bindparam("b_tick", type_=Integer) + 1,
        worker=bindparam("b_worker"),
        worker_pid=bindparam("b_pid"),
        updated_at=bindparam("b_now"),
    )
    .returning(
        _STEPS.c.pk,
        _STEPS.c.step_id,
        _STEPS.c.provider,
        _STEPS.c.provider_run_id,
        _STEPS.c.idempotency_key,
        _STEPS.c.attempt,
        _STEPS.c.started_at,
        _STEPS.c.last_provider_status,
        _STEPS.c.start_claimed_at,
        _STEPS.c.turn_stop,
    )
    .cte("fenced")
)
_STAMPED = (
    update(_RUNS)
    .where(
        _RUNS.c.id == bindparam("b_run"),
        _RUNS.c.status == RunStatus.RUNNING.value,
        _RUNS.c.cancel_requested_at.is_(None),
        exists(select(1).select_from(_FENCED)),
    )
    .values(
        heartbeat_at=bindparam("b_now"),
        current_step=bindparam("b_index"),
        updated_at=bindparam("b_now"),
        deadline_at=bindparam("b_deadline"),
    )
    .returning(_RUNS.c.id)
    .cte("stamped")
)
#: Built once: a poll pays only for binding its parameters (named ``b_…``: a parameter named
#: after a column of the updated table would be taken as a value to set).
_FENCE_AND_STAMP = select(
    _FENCED, exists(select(1).select_from(_STAMPED)).label("stamped")
).execution_options(synchronize_session=False)


def attempt(
    transact: Transact,
    settings: Settings,
    run_id: str,
    index: int,
    tick: int,
    now: datetime,
    *,
    worker: str | None,
    pid: int | None,
) -> Entry | int:
    """The entry of a plain poll, in one statement; otherwise the tick the full entry goes on
    from. Only a redelivered message (``tick`` past 0, most likely a poll) tries it, and only
    on a database that has data-modifying CTEs."""
    if not tick or not available(settings.database_url):
        return tick
    found = transact(
        lambda session: Done(
            enter(session, settings, run_id, index, tick, now, worker=worker, pid=pid)
        ),
        autocommit=True,
    )
    if isinstance(found, Entry):
        return found
    return tick if found is None else found.tick


@dataclass(frozen=True)
class Fenced:
    """The statement fenced the step but could not stamp the run: the full entry goes on
    from ``tick``, the one this execution now holds."""

    tick: int


@functools.lru_cache(maxsize=8)
def available(database_url: str) -> bool:
    """Whether the database runs data-modifying CTEs (PostgreSQL)."""
    return make_url(normalize_url(database_url)).get_backend_name() == "postgresql"


def enter(
    session: Session,
    settings: Settings,
    run_id: str,
    index: int,
    tick: int,
    now: datetime,
    *,
    worker: str | None,
    pid: int | None,
) -> Entry | Fenced | None:
    """Fence and stamp a poll in one statement: the :class:`Entry` of a plain poll,
    :class:`Fenced` when only the fence took, ``None`` when the statement wrote nothing."""
    row = session.execute(
        _FENCE_AND_STAMP,
        {
            "b_run": run_id,
            "b_index": index,
            "b_tick": tick,
            "b_worker": worker,
            "b_pid": pid,
            "b_now": now,
            "b_deadline": deadlines.compute(settings, RunStatus.RUNNING, heartbeat_at=now),
        },
    ).first()
    if row is None:
        return None
    if not row.stamped:
        return Fenced(tick + 1)
    step = StepRow(
        row.pk,
        run_id,
        row.step_id,
        row.provider,
        StepStatus.RUNNING,
        row.provider_run_id,
        str(row.idempotency_key),
        row.attempt,
        row.started_at,
        row.last_provider_status,
        row.start_claimed_at,
        turn_stop=row.turn_stop,
        index=index,
    )
    spec = specs.of_run(session, run_id)[index]
    return Entry(Phase.POLL, tick + 1, step, spec, RunStatus.RUNNING)
