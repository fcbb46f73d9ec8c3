"""Chains of step tasks: planned, stored and returned for sending in bounded segments.

:func:`arm` is the one way a chain is re-sent: when a queued run gets its key, when the
sweeper re-arms a dead heartbeat, when ``answer`` resumes a human park, and when the last link
of a segment finishes its step. A launch plans its first segment with :func:`plan_chain` and
stores the task ids in the rows it inserts (the same columns ``arm`` writes), so it does not
read back what it has just written. A segment holds at most :data:`SEGMENT_LINKS`
links, so a step message stays the same size whatever the run's length; a polling step's
retry carries no chain at all (the step task drops it), and the step that finishes without
a next link in its message arms the next segment in the same transaction.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, select, text, update
from sqlalchemy.orm import Session

from orchestration.core import deadlines
from orchestration.core.db import constant_in
from orchestration.core.followups import ChainPlan, Followups, Link
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import STEP_LIVE, RunStatus
from orchestration.runs.transitions import touch_run
from orchestration.workflows import decoded

#: Most step tasks one chain message carries (itself and the links after it).
SEGMENT_LINKS = 2

#: A literal condition (an IN list cannot be expanded inside an executemany).
_LIVE_STEP_SQL = text(
    "status IN ({})".format(", ".join(f"'{status.value}'" for status in sorted(STEP_LIVE)))
)


_STEPS = cast(Table, Step.__table__)
#: A segment's task ids, one executemany.
_TASK_IDS = (
    update(_STEPS)
    .where(
        _STEPS.c.run_id == bindparam("b_run"),
        _STEPS.c.index == bindparam("step_index"),
        _LIVE_STEP_SQL,
    )
    .values(celery_task_id=bindparam("task_id"), updated_at=bindparam("b_now"))
)
#: The run's columns an arming writes from, and its first live step from ``first`` on (none:
#: ``first_index`` is NULL), in one statement built once.
_FIRST_LIVE = (
    select(
        Run.task_ids,
        Run.status,
        Run.park_reason,
        Run.parked_since,
        Run.waiting_until,
        Run.cancel_requested_at,
        Step.index.label("first_index"),
        Step.polls.label("first_polls"),
    )
    .select_from(Run)
    .outerjoin(
        Step,
        and_(
            Step.run_id == Run.id,
            constant_in(Step.status, STEP_LIVE),
            Step.index >= bindparam("first"),
        ),
    )
    .where(Run.id == bindparam("run"))
    .order_by(Step.index)
    .limit(1)
)


def plan_chain(run_id: str, first_index: int, count: int, first_tick: int = 0) -> ChainPlan:
    """Choose task ids for one segment from step ``first_index`` of a ``count``-step run."""
    last = min(count, first_index + SEGMENT_LINKS)
    return ChainPlan(
        run_id,
        tuple(
            Link(index, uuid.uuid4().hex, first_tick if index == first_index else 0)
            for index in range(first_index, last)
        ),
    )


def arm(
    session: Session,
    settings: Settings,
    run: Run,
    *,
    now: datetime,
    concurrency: str | None = None,
    rearm: bool = False,
    first_index: int | None = None,
) -> Followups:
    """Plan a segment from the run's first unfinished step (or ``first_index``), store its
    task ids, stamp the heartbeat and the deadline, and return it to send after commit.

    The first link carries the step's current fencing tick, so whichever of this message and a
    late redelivery of the old one runs first wins, and the other is a no-op.
    """
    # Read the columns as they are now (transitions write SQL directly: ``answer`` has just
    # reset the step's start, for one), and not the workflow: its specs are cached.
    row = session.execute(
        _FIRST_LIVE, {"run": run.id, "first": 0 if first_index is None else first_index}
    ).first()
    if row is None or row.first_index is None:
        return Followups()
    start, polls = row.first_index, row.first_polls
    steps = decoded.of_run(session, run.id)
    plan = plan_chain(run.id, start, len(steps), polls)
    values: dict[str, Any] = {
        "task_ids": [*row.task_ids, *plan.task_ids],
        "heartbeat_at": now,
        "current_step": start,
        "deadline_at": deadlines.compute(
            settings,
            RunStatus(row.status),
            heartbeat_at=now,
            park_reason=row.park_reason,
            parked_since=row.parked_since,
            waiting_until=row.waiting_until,
            cancel_requested_at=row.cancel_requested_at,
        ),
    }
    if concurrency is not None:
        values["concurrency"] = concurrency
    if rearm:
        values["rearms"] = Run.rearms + 1
    touch_run(session, run.id, now, **values)
    # One executemany for the segment; guarded like every step write: only live steps take a
    # task id, and a step's index is its position in the run.
    session.execute(
        _TASK_IDS,
        [
            {"b_run": run.id, "b_now": now, "step_index": link.index, "task_id": link.task_id}
            for link in plan.links
        ],
    )
    return Followups(chains=(plan,))
