"""A new step's start on PostgreSQL: fence, claim and stamp in one statement, no transaction.

Most starts are the first delivery of a link (tick 0) to a step that is pending at its first
attempt, in a running run, with a task that names no data. For those the full entry is a
transaction of two statements: the fence and stamp, then the claim (the step to ``running``
with its rendered input and ``start_claimed_at``, journaled). Here the fence writes the
claim's columns itself, the journal row is selected from what the fence returned, and the run
is stamped only when the fence took, as a poll's entry stamps it (``fence``). One statement is
atomic by itself: one round trip instead of four, durable like the claim it carries.

Invariant 2 holds as in the full entry: the stamp is the compare-and-set on "running, no
cancel requested" that takes the run row's lock, and the provider is called only when it took.
The fence itself claims only while the statement's snapshot shows the run running with no
cancel requested; a cancel that commits after that snapshot fails the stamp (the run's new row
version is checked again once its lock is free). The execution then calls no provider and goes
on with the full entry from the tick it fenced, which honours the cancel; the claim it leaves
is on a step the cancel ends. (Only a cancel or the run's end can take a running run's status
between two steps: parks and waits are its executing step's own. Were the run still live,
the claim would hold a start off for one claim window, as a dead execution's does.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Table, bindparam, exists
from sqlalchemy.orm import Session

from orchestration import specs
from orchestration.db import postgresql_url
from orchestration.execution import fence
from orchestration.execution.entry import Entry, Phase, step_row
from orchestration.execution.starting import StartCall, plain_task, start_call
from orchestration.followups import Done, Transact
from orchestration.models import RunEvent
from orchestration.settings import Settings
from orchestration.states import RunStatus, StepStatus

_EVENTS: Table = RunEvent.__table__  # type: ignore[assignment]
#: What the full claim journals for a first attempt.
CAUSE = "turn starting"

_CLAIM = fence.FENCE.where(
    fence.STEPS.c.status == StepStatus.PENDING.value,
    fence.STEPS.c.attempt == 1,
    fence.STEPS.c.start_claimed_at.is_(None),
    fence.STEPS.c.started_at.is_(None),
    fence.STEPS.c.provider_run_id.is_(None),
    exists().where(
        fence.RUNS.c.id == bindparam("b_run"),
        fence.RUNS.c.status == RunStatus.RUNNING.value,
        fence.RUNS.c.cancel_requested_at.is_(None),
    ),
).values(
    status=StepStatus.RUNNING.value,
    cause=CAUSE,
    input=bindparam("b_input", type_=fence.STEPS.c.input.type),
    start_claimed_at=bindparam("b_now"),
    started_at=bindparam("b_now"),
    retry_at=None,
)


FENCE_CLAIM_AND_STAMP = fence.fence_and_stamp(_CLAIM)


@dataclass(frozen=True)
class Started:
    """A start claimed by the one statement: the entry, as the full entry's fence would have
    read the step, and the call to make."""

    entry: Entry
    call: StartCall


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
) -> Started | int:
    """The start of a new step, in one statement; otherwise the tick the full entry goes on
    from: the message's when the statement did not fence, the next one when it fenced and
    claimed but could not stamp the run.
    Only a first delivery (``tick`` 0) tries it, not for a run's first step (its run is
    still ``queued``, which the full claim moves on), and only on PostgreSQL."""
    if tick or not index or not postgresql_url(settings.database_url):
        return tick
    bound = fence.running_params(settings, run_id, index, tick, now, worker, pid)

    def enter(session: Session) -> Done[Started | int]:
        steps = specs.of_run(session, run_id)
        # No such step (the run is gone, retention purged it): the full entry halts.
        rendered = plain_task(settings, steps[index]) if index < len(steps) else None
        if rendered is None:
            return Done(tick)
        spec = steps[index]
        row = session.execute(FENCE_CLAIM_AND_STAMP, {**bound, "b_input": rendered}).first()
        if row is None:
            return Done(tick)
        if not row.stamped:
            return Done(tick + 1)
        # The step as the full entry's fence reads it, before its claim: the statement only
        # fences a step pending at its first attempt, never started or claimed.
        step = dataclasses.replace(
            step_row(row, run_id, index),
            status=StepStatus.PENDING,
            started_at=None,
            start_claimed_at=None,
        )
        entry = Entry(Phase.START, tick + 1, step, spec, RunStatus.RUNNING)
        return Done(Started(entry, start_call(settings, entry, rendered, now)))

    return transact(enter, autocommit=True)
