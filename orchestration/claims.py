"""Concurrency keys: at most one active run per (owner, key).

The holder has ``claim = 'holding'``, enforced by a unique partial index. A launch onto a held
key is rejected, queued behind the holder (``claim = 'queued'``, started when the holder ends
by any terminal path, since every path goes through ``closing.close_run``), or preempts the
holder. A holder that is stalled (dead heartbeat, park past budget) is displaced in the same
transaction as the takeover: closed ``interrupted``/``displaced`` and flagged for review.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration import deadlines, turns
from orchestration.db import after_commit, utcnow
from orchestration.errors import ConflictError
from orchestration.health import derive
from orchestration.models import Run
from orchestration.settings import Settings
from orchestration.states import Health, RunStatus, StopReason
from orchestration.transitions import lock_run

if TYPE_CHECKING:
    from orchestration.dispatch import Dispatcher


class OnConflict(StrEnum):
    """What a launch does when its concurrency key is held."""

    #: Refuse the launch with a conflict error.
    REJECT = "reject"
    #: Queue the run; it starts when the holder ends.
    ENQUEUE = "enqueue"
    #: Cancel the holder (stop_reason ``preempted``) and take the key.
    INTERRUPT = "interrupt"


HOLDING = "holding"
QUEUED = "queued"


def holder(session: Session, owner: str, key: str) -> Run | None:
    """The run holding ``key`` for ``owner``, locked for the rest of the transaction."""
    return session.scalars(
        select(Run)
        .where(Run.owner == owner, Run.concurrency_key == key, Run.claim == HOLDING)
        .with_for_update()
    ).first()


def acquire(
    session: Session,
    settings: Settings,
    dispatcher: Dispatcher | None,
    *,
    owner: str,
    key: str,
    on_conflict: OnConflict,
    now: datetime,
) -> str:
    """Decide the new run's claim (``holding`` or ``queued``), ending the holder if needed."""
    from orchestration.closing import close_run

    current = holder(session, owner, key)
    if current is None:
        return HOLDING
    if derive(settings, current, now) is Health.STALLED:
        _stop_later(session, settings, dispatcher, current)
        close_run(
            session,
            settings,
            current.id,
            RunStatus.INTERRUPTED,
            stop_reason=StopReason.DISPLACED,
            cause=f"concurrency key {key!r} taken over from a stalled holder",
            now=now,
            extra={"needs_review": True},
            dispatcher=dispatcher,
            promote=False,
        )
        return HOLDING
    if on_conflict is OnConflict.REJECT:
        raise ConflictError(
            f"concurrency key {key!r} is held by run {current.id} ({current.status}); retry "
            "when it ends, or launch with on_conflict 'enqueue' or 'interrupt'"
        )
    if on_conflict is OnConflict.ENQUEUE:
        return QUEUED
    _stop_later(session, settings, dispatcher, current)
    close_run(
        session,
        settings,
        current.id,
        RunStatus.CANCELLED,
        stop_reason=StopReason.PREEMPTED,
        cause=f"preempted by a new run on concurrency key {key!r}",
        now=now,
        extra={"cancel_requested_at": now},
        dispatcher=dispatcher,
        promote=False,
    )
    return HOLDING


def _stop_later(
    session: Session, settings: Settings, dispatcher: Dispatcher | None, run: Run
) -> None:
    """After the ending commits, revoke the run's tasks and cancel its provider turns."""
    now = utcnow()
    lock_run(session, run.id, now)
    task_ids = list(run.task_ids)
    live = turns.live_turns(session, run)
    if dispatcher is not None:
        after_commit(session, lambda: dispatcher.revoke(task_ids, terminate=True))
    turns.stop_later(session, settings, dispatcher, turns.pending(live), now)


def release(
    session: Session,
    settings: Settings,
    run_id: str,
    *,
    now: datetime,
    dispatcher: Dispatcher | None,
    promote: bool,
) -> None:
    """The run ended: pass its key to the oldest queued run (started after commit)."""
    from orchestration import launching

    run = session.get(Run, run_id)
    if run is None or run.concurrency_key is None or not promote:
        return
    waiting = session.scalars(
        select(Run)
        .where(
            Run.owner == run.owner,
            Run.concurrency_key == run.concurrency_key,
            Run.claim == QUEUED,
            Run.status == RunStatus.QUEUED.value,
        )
        .order_by(Run.created_at, Run.id)
        .limit(1)
        .with_for_update()
    ).first()
    if waiting is None or holder(session, run.owner, run.concurrency_key) is not None:
        return
    launching.arm(session, settings, waiting, now=now, dispatcher=dispatcher, claim=HOLDING)


def queued_deadline(
    settings: Settings, holder_deadline: datetime | None, now: datetime
) -> datetime:
    """A run queued behind a holder starts (is re-armed) by the holder's deadline."""
    base = holder_deadline or now
    return deadlines.compute(settings, RunStatus.QUEUED, heartbeat_at=base, now=now)
