"""A poll's entry on PostgreSQL: fence and stamp in one statement, with no transaction around it.

Most executions are polls of a running turn on a running run. For those the entry is two
updates (``entry``): the fence on the step and the stamp on the run. PostgreSQL runs both in
one statement (data-modifying CTEs), and one statement is atomic by itself, so it needs no
``BEGIN`` and ``COMMIT``: one round trip instead of four. The stamp is conditional on the
fence (``EXISTS (SELECT 1 FROM fenced)``), so a duplicate delivery writes nothing.

The statement (``fence.FENCE_AND_STAMP_POLL``) only fences a step that is running with a
provider turn. What it cannot take is left to the full entry, in a transaction: no row (a
start, a parked or retrying step, a duplicate) goes on with the message's tick; a row that
was fenced but not stamped (the run is not plainly running: a cancel requested, parked,
waiting) goes on with the tick it fenced.
SQLite has no data-modifying CTEs: there every execution takes the full entry.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from orchestration import deadlines, specs
from orchestration.db import normalize_url
from orchestration.execution import fence
from orchestration.execution.entry import Entry, Phase, step_row
from orchestration.followups import Done, Transact
from orchestration.settings import Settings
from orchestration.states import RunStatus


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
    deadline = deadlines.compute(settings, RunStatus.RUNNING, heartbeat_at=now)
    row = session.execute(
        fence.FENCE_AND_STAMP_POLL, fence.params(run_id, index, tick, now, deadline, worker, pid)
    ).first()
    if row is None:
        return None
    if not row.stamped:
        return Fenced(tick + 1)
    spec = specs.of_run(session, run_id)[index]
    return Entry(Phase.POLL, tick + 1, step_row(row, run_id, index), spec, RunStatus.RUNNING)
