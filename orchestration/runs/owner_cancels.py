"""Suspend an owner, then cancel every live run of it (``owners suspend --cancel-live``, the
Python API's ``suspend_owner`` and ``POST /operator/owners/{owner}/suspend``: one sequence,
:func:`suspend_owner`, for all three).

Each run is cancelled through the normal cancel path (:mod:`.cancellation`: the request, the
hard stop, the terminal rows), its journal's cause naming the suspension. Runs are read in
batches of ``batch`` top-level runs, in (created_at, id) order from where the last batch
ended, so the pass is bounded by the owner's runs however many there are; branch runs end
with their parent. Called after the suspension committed: no run of the owner can be launched
from then on (``limits/suspensions.py``), so one pass in that order finds every live run.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from orchestration.core.db import constant_in
from orchestration.core.followups import Done, Transact
from orchestration.core.models import Run
from orchestration.core.settings import Settings
from orchestration.core.states import RUN_LIVE, StopReason
from orchestration.limits import suspensions
from orchestration.runs import cancellation

#: Top-level runs read per batch by default.
BATCH = 100


class Suspended(NamedTuple):
    """What a suspend did: the owner's suspension (its first one when it already was), whether
    this call made it, and how many live runs it cancelled (``None``: none was asked)."""

    suspension: suspensions.Suspension
    new: bool
    cancelled: int | None


def suspend_owner(
    transact: Transact,
    settings: Settings,
    owner: str,
    *,
    reason: str,
    by: str,
    clock: Callable[[], datetime],
    cancel_live: bool = False,
    batch: int = BATCH,
    progress: Callable[[Suspended], None] | None = None,
) -> Suspended:
    """Suspend ``owner`` in a transaction of its own, then, with ``cancel_live``, cancel its
    live runs (:func:`cancel_live_runs`): only once the suspension committed does one pass find
    every live run. ``progress`` is told the outcome so far once the suspension committed
    (``cancelled`` still ``None``), then after each batch of cancels. Raises
    :class:`~orchestration.core.errors.ValidationError` (nothing written, nothing cancelled)
    for a bad owner or reason, as :func:`suspensions.suspend` does."""
    found, new = transact(
        lambda session: Done(suspensions.suspend(session, owner, clock(), reason=reason, by=by))
    )
    if progress is not None:
        progress(Suspended(found, new, None))
    if not cancel_live:
        return Suspended(found, new, None)
    told = None if progress is None else (lambda count: progress(Suspended(found, new, count)))
    cancelled = cancel_live_runs(
        transact, settings, found, clock=clock, batch=batch, progress=told, by=by
    )
    return Suspended(found, new, cancelled)


def live_batch(
    session: Session, owner: str, after: tuple[datetime, str] | None, batch: int
) -> list[tuple[datetime, str]]:
    """Up to ``batch`` live top-level runs of ``owner`` after ``after``, as (created_at, id)."""
    query = select(Run.created_at, Run.id).where(
        Run.owner == owner, Run.parent_run_id.is_(None), constant_in(Run.status, RUN_LIVE)
    )
    if after is not None:
        query = query.where(
            or_(
                Run.created_at > after[0],
                and_(Run.created_at == after[0], Run.id > after[1]),
            )
        )
    rows = session.execute(query.order_by(Run.created_at, Run.id).limit(batch))
    return [(row[0], row[1]) for row in rows]


def cancel_live_runs(
    transact: Transact,
    settings: Settings,
    suspension: suspensions.Suspension,
    *,
    clock: Callable[[], datetime],
    batch: int = BATCH,
    progress: Callable[[int], None] | None = None,
    by: str | None = None,
) -> int:
    """Cancel every live run of the suspended owner; how many this call cancelled (a run
    another writer ended first is not counted). ``progress`` is told the running count
    after each batch. ``by`` is who asked, in the journal and the audit (default: who
    suspended the owner; a later suspend with ``cancel_live`` is another operator's ask)."""
    owner = suspension.owner
    asked = by or suspension.by
    requester = f"{asked} (owner {owner!r} suspended)"
    cause = suspensions.cancel_cause(suspension)
    cancelled = 0
    after: tuple[datetime, str] | None = None
    while True:
        found = transact(
            lambda session: Done(live_batch(session, owner, after, batch))  # noqa: B023
        )
        for _, run_id in found:
            requested = cancellation.request(
                transact, settings, run_id, now=clock(), by=requester, stop=True
            )
            if requested is None:
                continue
            ended = cancellation.finish(
                transact,
                settings,
                run_id,
                now=clock(),
                stop_reason=StopReason.CANCEL_REQUESTED,
                cause=cause,
                revoke=True,
                live=requested.live,
            )
            cancelled += int(ended)
        if progress is not None:
            progress(cancelled)
        if len(found) < batch:
            break
        after = found[-1]

    def audit(session: Session) -> Done[None]:
        suspensions.record(
            session,
            owner,
            clock(),
            "cancelled_live",
            by=asked,
            reason=suspension.reason,
            detail={"cancelled": cancelled},
        )
        return Done(None)

    transact(audit)
    return cancelled
