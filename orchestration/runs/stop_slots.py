"""Each owner's share of the stop task (issue 30): at most ``ORCH_STOP_TURNS_PER_OWNER``
provider cancels of one owner's turns in flight at once.

A provider cancel may take up to its bound (``ORCH_PROVIDER_TIMEOUT``). An owner whose runs
end in bulk (10,000 dead-heartbeat runs closed by the sweeper, a mass cancel) hands as many
stops to the stop task; taken in queue order, against a provider that hangs, they would hold
every worker process for that owner alone while other owners' stops (and steps) wait. So a
stop first takes one of its owner's numbered slots: the key is (owner, slot), which makes the
bound exact across workers. With none free it goes back to the end of the queue after
:data:`WAIT` seconds without spending an attempt, so the owners' stops take turns. A slot
whose holder died (a killed worker) is free again once it is older than the stop task's
hard time limit (``hold``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestration.core.followups import Done, Transact
from orchestration.core.models import Run, StopSlot
from orchestration.core.settings import Settings
from orchestration.runs import turns

#: Seconds a stop waits for its owner's slot before it asks again.
WAIT = 2.0


def take(
    session: Session,
    settings: Settings,
    owner: str,
    run_id: str,
    index: int,
    now: datetime,
    *,
    hold: float,
) -> int | None:
    """A free slot of ``owner``'s for the stop of step ``index`` of ``run_id`` (a slot taken
    more than ``hold`` seconds ago counts as free), or ``None`` when all are held."""
    stale = now - timedelta(seconds=hold)
    held = {
        row.slot: row for row in session.scalars(select(StopSlot).where(StopSlot.owner == owner))
    }
    for slot in range(settings.stop_turns_per_owner):
        row = held.get(slot)
        if row is None:
            try:
                with session.begin_nested():  # another stop took it meanwhile: try the next
                    session.add(
                        StopSlot(
                            owner=owner, slot=slot, run_id=run_id, step_index=index, taken_at=now
                        )
                    )
            except IntegrityError:
                continue
            return slot
        if row.taken_at < stale and _taken_over(session, row, run_id, index, now):
            return slot
    return None


def _taken_over(session: Session, row: StopSlot, run_id: str, index: int, now: datetime) -> bool:
    """Take a stale slot from its dead holder (compare-and-set on when it was taken)."""
    moved = session.execute(
        update(StopSlot)
        .where(
            StopSlot.owner == row.owner,
            StopSlot.slot == row.slot,
            StopSlot.taken_at == row.taken_at,
        )
        .values(run_id=run_id, step_index=index, taken_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(moved, "rowcount", 0) or 0) == 1


def release(session: Session, owner: str, slot: int, run_id: str, index: int) -> Done[None]:
    """Free the slot, unless another stop took it over meanwhile."""
    session.execute(
        delete(StopSlot).where(
            StopSlot.owner == owner,
            StopSlot.slot == slot,
            StopSlot.run_id == run_id,
            StopSlot.step_index == index,
        )
    )
    return Done(None)


def attempt(
    transact: Transact,
    settings: Settings,
    run_id: str,
    index: int,
    now: datetime,
    *,
    hold: float,
) -> float | None:
    """One attempt of a pending stop within its owner's share (the stop task): the slot, the
    provider call (:func:`turns.attempt`), the slot freed. Returns the countdown before the
    task runs again (:data:`WAIT` when the owner's slots are all held), or ``None`` when the
    stop is settled."""

    def claim(session: Session) -> Done[tuple[str, int | None] | None]:
        owner = session.scalar(select(Run.owner).where(Run.id == run_id))
        if owner is None:
            return Done(None)
        return Done((owner, take(session, settings, owner, run_id, index, now, hold=hold)))

    claimed = transact(claim)
    if claimed is None:  # no such run: nothing to stop
        return None
    owner, slot = claimed
    if slot is None:
        return WAIT
    try:
        return turns.attempt(transact, settings, run_id, index, now)
    finally:
        transact(lambda session: release(session, owner, slot, run_id, index))
