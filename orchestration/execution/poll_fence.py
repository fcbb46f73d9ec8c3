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

from datetime import datetime

from sqlalchemy.orm import Session

from orchestration import specs
from orchestration.db import postgresql_url
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
    from: the message's when the statement wrote nothing, the next one when it fenced the step
    but could not stamp the run. Only a redelivered message (``tick`` past 0, most likely a
    poll) tries it, and only on a database that has data-modifying CTEs."""
    if not tick or not postgresql_url(settings.database_url):
        return tick
    bound = fence.running_params(settings, run_id, index, tick, now, worker, pid)

    def enter(session: Session) -> Done[Entry | int]:
        row = session.execute(fence.FENCE_AND_STAMP_POLL, bound).first()
        if row is None:
            return Done(tick)
        if not row.stamped:
            return Done(tick + 1)
        spec = specs.of_run(session, run_id)[index]
        step = step_row(row, run_id, index)
        return Done(Entry(Phase.POLL, tick + 1, step, spec, RunStatus.RUNNING))

    return transact(enter, autocommit=True)
