"""Concurrency keys: at most one active run per (owner, key).

The holder has ``concurrency = 'holding'``, enforced by a unique partial index. A launch onto a held
key is rejected, queued behind the holder (``concurrency = 'queued'``, started when the holder ends
by any terminal path, since every path goes through ``closing.end_run``), or preempts the
holder. A holder that is stalled (dead heartbeat, park past budget) is displaced in the same
transaction as the takeover: closed ``interrupted``/``displaced`` and flagged for review.

This module decides; ``launching`` carries the decision out (it ends a displaced holder
through ``closing``), so the two never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core import deadlines, health
from orchestration.core.errors import ConflictError
from orchestration.core.models import Run
from orchestration.core.settings import Settings
from orchestration.core.states import ConcurrencyState, Health, RunStatus, StopReason


class OnConflict(StrEnum):
    """What a launch does when its concurrency key is held."""

    #: Refuse the launch with a conflict error.
    REJECT = "reject"
    #: Queue the run; it starts when the holder ends.
    ENQUEUE = "enqueue"
    #: Cancel the holder (stop_reason ``preempted``) and take the key.
    INTERRUPT = "interrupt"


@dataclass(frozen=True)
class Ousting:
    """The current holder, to be ended so that the new run can take the key."""

    run_id: str
    to: RunStatus
    stop_reason: StopReason
    cause: str
    displaced: bool


@dataclass(frozen=True)
class Decision:
    """The new run's standing on its key, the holder's deadline (a queued run starts by it), and the
    holder to end first, if any."""

    concurrency: ConcurrencyState
    holder_deadline: datetime | None = None
    oust: Ousting | None = None


def holder(session: Session, owner: str, key: str) -> Run | None:
    """The run holding ``key`` for ``owner``, locked for the rest of the transaction."""
    return session.scalars(
        select(Run)
        .where(
            Run.owner == owner,
            Run.concurrency_key == key,
            Run.concurrency == ConcurrencyState.HOLDING,
        )
        .with_for_update()
    ).first()


def first_queued(session: Session, owner: str, key: str, *, lock: bool = False) -> Run | None:
    """The oldest run queued behind ``key`` for ``owner``."""
    query = (
        select(Run)
        .where(
            Run.owner == owner,
            Run.concurrency_key == key,
            Run.concurrency == ConcurrencyState.QUEUED,
            Run.status == RunStatus.QUEUED.value,
        )
        .order_by(Run.created_at, Run.id)
        .limit(1)
    )
    return session.scalars(query.with_for_update() if lock else query).first()


def decide(
    session: Session,
    settings: Settings,
    *,
    owner: str,
    key: str,
    on_conflict: OnConflict,
    now: datetime,
) -> Decision:
    """Decide the new run's standing on its key (``holding`` or ``queued``) and whom it
    ousts."""
    current = holder(session, owner, key)
    if current is None:
        return Decision(ConcurrencyState.HOLDING)
    judged = health.judge(session, settings, current.id, now)
    if judged is not None and judged.health is Health.STALLED:
        return Decision(
            ConcurrencyState.HOLDING,
            oust=Ousting(
                current.id,
                RunStatus.INTERRUPTED,
                StopReason.DISPLACED,
                f"concurrency key {key!r} taken over from a stalled holder",
                displaced=True,
            ),
        )
    if on_conflict is OnConflict.REJECT:
        raise ConflictError(
            f"concurrency key {key!r} is held by run {current.id} ({current.status}); retry "
            "when it ends, or launch with on_conflict 'enqueue' or 'interrupt'"
        )
    if on_conflict is OnConflict.ENQUEUE:
        return Decision(ConcurrencyState.QUEUED, holder_deadline=current.deadline_at)
    return Decision(
        ConcurrencyState.HOLDING,
        oust=Ousting(
            current.id,
            RunStatus.CANCELLED,
            StopReason.PREEMPTED,
            f"preempted by a new run on concurrency key {key!r}",
            displaced=False,
        ),
    )


def queued_deadline(
    settings: Settings, holder_deadline: datetime | None, now: datetime
) -> datetime:
    """A run queued behind a holder starts (is re-armed) by the holder's deadline."""
    base = holder_deadline or now
    return deadlines.compute(settings, RunStatus.QUEUED, heartbeat_at=base, now=now)
