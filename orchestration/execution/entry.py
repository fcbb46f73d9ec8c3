"""The start of every execution: the fence, the stamp and the phase (:mod:`.fence`'s pieces).

The fence's tick travels in the message, so of two deliveries of the same message (acks_late,
visibility-timeout redelivery, a re-arm racing a late original) exactly one proceeds and the
other halts without writing. A running run is stamped in the fence's pieces; any other
status is read first and stamped on the status it was read in. A first delivery whose task
renders without the run's data carries its start claim in the fence.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core import deadlines, pieces
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import RUN_TERMINAL, STEP_LIVE, RunStatus, StepStatus
from orchestration.execution import fence
from orchestration.execution.fence import Phase, Refusal
from orchestration.execution.outcomes import Halt
from orchestration.workflows import decoded
from orchestration.workflows.steps import StepSpec

__all__ = ["Entry", "Phase", "StepRow", "enter", "stamp", "still_fenced"]


@dataclass(frozen=True)
class StepRow:
    """The step's columns an execution reads, as the fence (or the claim) returned them."""

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
    #: Why its start may not be claimed now (``None``: it may), as :func:`fence.refusal`
    #: judged the row the statement wrote. A fence sent with no transaction around it, or
    #: carrying a claim, leaves it unjudged: :func:`still_fenced` or ``CLAIM`` judge it.
    refused: Refusal | None = None
    #: Whether this execution's statement claimed its start.
    claimed: bool = False

    @classmethod
    def of(cls, row: dict[str, Any], run_id: str, index: int) -> StepRow:
        """The step as :data:`fence.RETURNED` gives it."""
        refused = row["refused"]
        return cls(
            pk=row["pk"],
            run_id=run_id,
            step_id=row["step_id"],
            provider=row["provider"],
            status=StepStatus(row["status"]),
            provider_run_id=row["provider_run_id"],
            idempotency_key=str(row["idempotency_key"]),
            attempt=row["attempt"],
            started_at=row["started_at"],
            last_provider_status=row["last_provider_status"],
            start_claimed_at=row["start_claimed_at"],
            retry_at=row["retry_at"],
            turn_stop=row["turn_stop"],
            index=index,
            refused=None if refused is None else Refusal(refused),
            claimed=bool(row["claimed"]),
        )


@dataclass(frozen=True)
class Entry:
    """A fenced execution: its phase, its new tick, the step and the run's status; ``stamped``
    is whether the run's stamp was written with the fence (``False``: it still must be)."""

    phase: Phase
    tick: int
    step: StepRow
    spec: StepSpec
    run_status: RunStatus
    stamped: bool = True


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
    rendered: Any = None,
    quick: bool = False,
) -> Entry | Halt:
    """Fence the step with ``tick`` and stamp a running run (claiming the start with the task
    ``rendered`` before the fence, when given); a :class:`Halt` when this delivery must not
    proceed (a duplicate, a stale one, or the run or step has ended). An entry that is not
    ``stamped`` must go on with :func:`stamp` in a transaction.

    ``quick``: sent with no transaction around it, a poll's fence and stamp are not durable
    (the engine recovers their loss by design), and the refusal of a start it finds is
    judged by :func:`still_fenced`, in the transaction that goes on with it."""
    bound = fence.params(settings, run_id, index, tick, now, worker, pid)
    claiming = rendered is not None
    if claiming:
        sent = pieces.send(session, fence.ENTER_AND_CLAIM, {**bound, "b_input": rendered})
    else:
        entering = fence.ENTER_UNJUDGED if quick else fence.ENTER
        sent = pieces.send(session, entering, bound, durable=not quick)
    fenced, stamped = sent["fenced"], sent["stamped"]
    if fenced is None:
        return why_not(session, run_id, index)
    step = StepRow.of(fenced, run_id, index)
    spec = decoded.of_run(session, run_id)[index]
    if stamped is None:
        return Entry(Phase.START, tick + 1, step, spec, RunStatus.RUNNING, stamped=False)
    return Entry(Phase(stamped["phase"]), tick + 1, step, spec, RunStatus.RUNNING)


def stamp(session: Session, settings: Settings, run_id: str, entry: Entry, now: datetime) -> Entry:
    """Stamp the run of a fenced ``entry`` on the status it is read in (queued, parked,
    waiting, running, cancelling) and take its phase; ``Phase.CANCEL`` when a cancel is
    requested or the run has ended."""
    bound = fence.params(settings, run_id, entry.step.index, entry.tick - 1, now, None, None)
    for _ in range(3):
        run = session.scalars(
            select(Run).where(Run.id == run_id).execution_options(populate_existing=True)
        ).first()
        if run is None or run.status in RUN_TERMINAL or run.cancel_requested_at is not None:
            break
        status = RunStatus(run.status)
        bound["b_deadline"] = deadlines.for_run(settings, run, heartbeat_at=now)
        stamped = session.execute(fence.stamp((status,)), bound).first()
        if stamped is not None:
            return Entry(Phase(stamped.phase), entry.tick, entry.step, entry.spec, status)
    return Entry(Phase.CANCEL, entry.tick, entry.step, entry.spec, RunStatus.CANCELLING)


def still_fenced(
    session: Session, settings: Settings, run_id: str, entry: Entry, now: datetime
) -> Entry | None:
    """``entry`` with its step's refusal judged now (:data:`fence.JUDGE`), the step locked
    until the commit; ``None`` when it no longer holds the entry's tick. A quick entry goes
    on in a later transaction, and a newer delivery may have fenced the step in between
    (its writes then are the newer one's to make). The run is locked first (the stamp), as
    every execution locks them."""
    step = entry.step
    bound = fence.params(settings, run_id, step.index, entry.tick - 1, now, None, None)
    judged = session.execute(fence.JUDGE, {**bound, "b_pk": step.pk}).first()
    if judged is None:
        return None
    refused = None if judged.refused is None else Refusal(judged.refused)
    return replace(entry, step=replace(step, refused=refused))


_LIVE_STEPS = [status.value for status in STEP_LIVE]


def why_not(session: Session, run_id: str, index: int) -> Halt:
    """Why a delivery's fence did not take."""
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
