"""The start of every execution: fence, stamp and read, in the execution's first transaction.

The fence is ``UPDATE steps SET polls = tick + 1 WHERE polls = tick``, returning what the phase
needs. The tick travels in the message, so of two deliveries of the same message (acks_late,
visibility-timeout redelivery, a re-arm racing a late original) exactly one proceeds and the
other halts without writing. The stamp writes the heartbeat and the deadline with a
compare-and-set on the run's status: for a running run (every poll) it is one statement (on
PostgreSQL the fence and that stamp are one statement, see ``fence``); any other status is
read first and stamped on the status it was read in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from orchestration import deadlines, specs
from orchestration.db import on_postgresql
from orchestration.execution import fence
from orchestration.execution.outcomes import Halt
from orchestration.models import Run, Step
from orchestration.settings import Settings
from orchestration.states import (
    RUN_TERMINAL,
    STEP_LIVE,
    UNATTENDED_PARKS,
    RunStatus,
    StepStatus,
)
from orchestration.step_specs import StepSpec

_LIVE_STEPS = [status.value for status in STEP_LIVE]


class Phase(StrEnum):
    """What an execution does after its fence."""

    START = "start"
    POLL = "poll"
    EFFECTS = "effects"
    HUMAN = "human"
    CANCEL = "cancel"


@dataclass(frozen=True)
class StepRow:
    """The step's columns an execution reads, as the fence returned them."""

    pk: int
    run_id: str
    step_id: str
    provider: str
    status: StepStatus
    provider_run_id: str | None
    idempotency_key: str
    attempt: int
    started_at: datetime | None
    last_provider_status: str | None
    start_claimed_at: datetime | None
    #: A ``retrying`` step's next attempt starts no earlier than this.
    retry_at: datetime | None = None
    turn_stop: Any = None
    index: int = 0


@dataclass(frozen=True)
class Entry:
    """A fenced execution: its phase, its new tick, the step and the run's status."""

    phase: Phase
    tick: int
    step: StepRow
    spec: StepSpec
    run_status: RunStatus


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
) -> Entry | Halt:
    """Fence the step with ``tick`` and stamp the run; a :class:`Halt` when this delivery
    must not proceed (a duplicate, a stale one, or the run or step has ended)."""
    bound = fence.running_params(settings, run_id, index, tick, now, worker, pid)
    if on_postgresql(session):
        fenced = session.execute(fence.FENCE_AND_STAMP, bound).first()
        stamped = fenced is not None and bool(fenced.stamped)
    else:
        fenced = session.execute(fence.FENCE, bound).first()
        stamped = fenced is not None and (
            session.execute(fence.STAMP_RUNNING, bound).first() is not None
        )
    if fenced is None:
        return _why_not(session, run_id, index)
    step = step_row(fenced, run_id, index)
    spec = specs.of_run(session, run_id)[index]
    if stamped:
        return Entry(
            _phase(step, RunStatus.RUNNING, None, None, index),
            tick + 1,
            step,
            spec,
            RunStatus.RUNNING,
        )
    return _stamp_other(session, settings, run_id, index, step, spec, tick, now)


def step_row(fenced: Row[Any], run_id: str, index: int) -> StepRow:
    """The step as the fence returned it (``fence.FENCE``'s ``RETURNING`` columns first)."""
    (pk, step_id, provider, status, run_turn, key, attempt, started_at, last, claimed,
     retry_at, turn_stop) = tuple(fenced)[:12]  # fmt: skip
    return StepRow(
        pk,
        run_id,
        step_id,
        provider,
        StepStatus(status),
        run_turn,
        str(key),
        attempt,
        started_at,
        last,
        claimed,
        retry_at=retry_at,
        turn_stop=turn_stop,
        index=index,
    )


def _stamp_other(
    session: Session,
    settings: Settings,
    run_id: str,
    index: int,
    step: StepRow,
    spec: StepSpec,
    tick: int,
    now: datetime,
) -> Entry:
    """Stamp a run that is not plainly running (queued, parked, waiting, cancelling): read
    its status, compute the deadline for it, compare-and-set on it."""
    for _ in range(3):
        run = session.scalars(
            select(Run).where(Run.id == run_id).execution_options(populate_existing=True)
        ).first()
        if run is None or run.status in RUN_TERMINAL or run.cancel_requested_at is not None:
            break
        status = RunStatus(run.status)
        stamped = session.execute(
            update(Run)
            .where(
                Run.id == run_id,
                Run.status == status.value,
                Run.cancel_requested_at.is_(None),
            )
            .values(
                heartbeat_at=now,
                current_step=index,
                updated_at=now,
                deadline_at=deadlines.for_run(settings, run, heartbeat_at=now),
            )
            .execution_options(synchronize_session=False)
        )
        if stamped.rowcount == 1:  # type: ignore[attr-defined]
            phase = _phase(step, status, run.park_reason, run.current_step, index)
            return Entry(phase, tick + 1, step, spec, status)
    return Entry(Phase.CANCEL, tick + 1, step, spec, RunStatus.CANCELLING)


def _phase(
    step: StepRow,
    run_status: RunStatus,
    park_reason: str | None,
    current_step: int | None,
    index: int,
) -> Phase:
    if run_status is RunStatus.WAITING and current_step == index:
        return Phase.EFFECTS
    if step.status is StepStatus.PARKED and park_reason in UNATTENDED_PARKS:
        return Phase.HUMAN
    if step.status is StepStatus.PENDING or step.provider_run_id is None:
        return Phase.START
    return Phase.POLL


def _why_not(session: Session, run_id: str, index: int) -> Halt:
    status = session.scalar(select(Run.status).where(Run.id == run_id))
    if status is None:
        return Halt("no such run")
    if status in RUN_TERMINAL:
        return Halt(f"run is {status}", revoked=True)
    step_status = session.scalar(
        select(Step.status).where(Step.run_id == run_id, Step.index == index)
    )
    if step_status is None or step_status not in _LIVE_STEPS:
        return Halt("step already finished")
    return Halt("duplicate or stale delivery")
