"""The statements every execution starts with, built once on the tables (no ORM bookkeeping):
the fence on the step and the stamp on a running run; on PostgreSQL both in one statement.

The fence is ``UPDATE steps SET polls = tick + 1 WHERE polls = tick``, returning what the
phase needs; the stamp writes the heartbeat and the deadline with a compare-and-set on
``running`` and no cancel requested. PostgreSQL runs both as data-modifying CTEs of one
statement, the stamp conditional on the fence (``EXISTS (SELECT 1 FROM fenced)``), so a
duplicate delivery still writes nothing: one round trip instead of two. Every parameter is
named ``b_…``: a parameter named after a column of an updated table would be taken as a
value to set.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import (
    CTE,
    Insert,
    Integer,
    Select,
    Table,
    Update,
    bindparam,
    exists,
    func,
    select,
    update,
)

from orchestration import deadlines
from orchestration.db import constant_in
from orchestration.models import Run, Step
from orchestration.settings import Settings
from orchestration.states import STEP_LIVE, RunStatus, StepStatus

STEPS: Table = Step.__table__  # type: ignore[assignment]
RUNS: Table = Run.__table__  # type: ignore[assignment]

FENCE = (
    update(STEPS)
    .where(
        STEPS.c.run_id == bindparam("b_run"),
        STEPS.c.index == bindparam("b_index"),
        STEPS.c.polls == bindparam("b_tick"),
        constant_in(STEPS.c.status, STEP_LIVE),
    )
    .values(
        polls=bindparam("b_tick", type_=Integer) + 1,
        worker=bindparam("b_worker"),
        worker_pid=bindparam("b_pid"),
        updated_at=bindparam("b_now"),
    )
    .returning(
        STEPS.c.pk,
        STEPS.c.step_id,
        STEPS.c.provider,
        STEPS.c.status,
        STEPS.c.provider_run_id,
        STEPS.c.idempotency_key,
        STEPS.c.attempt,
        STEPS.c.started_at,
        STEPS.c.last_provider_status,
        STEPS.c.start_claimed_at,
        STEPS.c.retry_at,
        STEPS.c.turn_stop,
    )
)
STAMP_RUNNING = (
    update(RUNS)
    .where(
        RUNS.c.id == bindparam("b_run"),
        RUNS.c.status == RunStatus.RUNNING.value,
        RUNS.c.cancel_requested_at.is_(None),
    )
    .values(
        heartbeat_at=bindparam("b_now"),
        current_step=bindparam("b_index"),
        updated_at=bindparam("b_now"),
        deadline_at=bindparam("b_deadline"),
    )
    .returning(RUNS.c.id)
)


def fence_and_stamp(
    fence: Update, *, durable: bool = True, journal: Callable[[CTE], Insert] | None = None
) -> Select[Any]:
    """``fence`` and the running stamp as one statement: the fenced row, with ``stamped``
    saying whether the stamp took (no row: the fence did not).

    Not ``durable``: the statement, sent in autocommit, commits without waiting for its WAL
    to reach the disk (``synchronous_commit`` off for its own implicit transaction only).
    Only a poll's fence is sent so: a server crash can lose it, but never a later durable
    commit (WAL is flushed in order), and what it loses (a tick, a heartbeat) the engine
    recovers by design: the next message's tick no longer fences, and the sweeper re-arms
    the run once the heartbeat it kept is dead.

    ``journal``: given the fence's CTE, the journal row of the status the fence sets, as an
    ``INSERT … SELECT … FROM`` it, so that the row is written exactly when the fence took."""
    fenced = fence.cte("fenced")
    stamped = STAMP_RUNNING.where(exists(select(1).select_from(fenced))).cte("stamped")
    statement = select(fenced, exists(select(1).select_from(stamped)).label("stamped"))
    if journal is not None:
        # PostgreSQL runs a data-modifying CTE to completion though nothing reads it.
        statement = statement.add_cte(journal(fenced).cte("journal"))
    if durable:
        return statement
    return statement.add_columns(
        func.set_config("synchronous_commit", "off", True).label("commit_mode")
    )


#: Any live step, as the full entry fences it.
FENCE_AND_STAMP = fence_and_stamp(FENCE)
#: Only a step that is running with a provider turn: a plain poll (``poll_fence``).
FENCE_AND_STAMP_POLL = fence_and_stamp(
    FENCE.where(STEPS.c.status == StepStatus.RUNNING.value, STEPS.c.provider_run_id.is_not(None)),
    durable=False,
)


def params(
    run_id: str, index: int, tick: int, now: Any, deadline: Any, worker: str | None, pid: int | None
) -> dict[str, Any]:
    """The bound values of the fence and the stamp."""
    return {
        "b_run": run_id,
        "b_index": index,
        "b_tick": tick,
        "b_worker": worker,
        "b_pid": pid,
        "b_now": now,
        "b_deadline": deadline,
    }


def running_params(
    settings: Settings,
    run_id: str,
    index: int,
    tick: int,
    now: datetime,
    worker: str | None,
    pid: int | None,
) -> dict[str, Any]:
    """The bound values of the fence and of the stamp of a running run, whose deadline is the
    one a heartbeat at ``now`` gives it."""
    deadline = deadlines.compute(settings, RunStatus.RUNNING, heartbeat_at=now)
    return params(run_id, index, tick, now, deadline, worker, pid)
