"""Cancel: the request, the hard path that lands before it returns, and the cooperative end.

Ordering that gives invariant 2 (no provider turn starts after ``cancel`` returns): the
request is written first, under the run row's lock; a step claims a provider start
(``steps.start_claimed_at``, a compare-and-set under the same lock) only while no cancel is
requested. So once the request has committed, no start can begin; a start already in flight
ends within one provider call (the transport's hard deadline), and ``finish`` waits for its
claim to clear before it reads the turns to stop. No lock is held across the provider call.

A run with branches (``for_each``, ``parallel``) is cancelled with them: its request is
recorded first (so its step admits no more branches), then each live branch run's, and
``finish`` ends every branch run the same way before the parent.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from orchestration.core import deadlines, ownership
from orchestration.core.db import constant_in
from orchestration.core.errors import IllegalTransition
from orchestration.core.followups import Done, Followups, Transact
from orchestration.core.models import Run, Step
from orchestration.core.settings import MARGIN_SECONDS, Settings
from orchestration.core.states import RUN_TERMINAL, STEP_LIVE, RunStatus, StopReason
from orchestration.runs import closing, turns
from orchestration.runs.transitions import take_run, transition_run

#: How often ``cancel`` looks whether a provider start in flight has ended (seconds).
_START_POLL_SECONDS = 0.02


def request(
    transact: Transact,
    settings: Settings,
    run_id: str,
    *,
    now: datetime,
    by: str,
    stop: bool = False,
    owner: str | None = None,
) -> Requested | None:
    """Record the cancel request and move the run to ``cancelling``, then wait until no
    provider start of the run is in flight (at most one provider call): from the return on,
    no turn can start, graceful or not.

    ``owner``: the caller's, checked on the row the request locks; another owner's live run
    is :class:`RunNotFound`, its request rolled back, so an owner's cancel needs no read of
    its own first (another owner's ended run is not touched: the caller's read of the record
    finds it not theirs).

    ``stop`` (a hard cancel, :func:`finish` next): when no start was in flight and the run
    has no branch runs, its live turns are read under the request's lock and its tasks are
    revoked as soon as the request commits, so ``finish`` needs no read of its own.

    Returns ``None`` when the run is already terminal (nothing to do).
    """
    recorded = transact(
        lambda session: _record_request(session, settings, run_id, now, by, stop=stop, owner=owner)
    )
    if recorded is None:
        return None
    for branch in recorded.branches:
        transact(functools.partial(_request_branch, settings, branch, now, by))
    if recorded.in_flight:
        _await_starts(transact, settings, run_id, now)
    for branch in recorded.branches:
        _await_starts(transact, settings, branch, now)
    return recorded


@dataclass(frozen=True)
class Requested:
    """What the request's transaction saw under the run row's lock: the live branch runs to
    cancel with it, whether a provider start was in flight, and ``live``: the run's live
    turns, read under that lock, its tasks revoked after its commit (``None`` when
    :func:`finish` must read them: a start was in flight, the run has branch runs, or no
    ``stop`` was asked)."""

    branches: tuple[str, ...]
    in_flight: bool
    live: list[turns.LiveTurn] | None = None


def _request_branch(
    settings: Settings, run_id: str, now: datetime, by: str, session: Session
) -> Done[bool]:
    recorded = _record_request(session, settings, run_id, now, f"{by}, with its parent")
    return Done(recorded.value is not None)


def _record_request(
    session: Session,
    settings: Settings,
    run_id: str,
    now: datetime,
    by: str,
    *,
    stop: bool = False,
    owner: str | None = None,
) -> Done[Requested | None]:
    # This UPDATE takes the run row's lock: it waits for a step that is claiming a start, and
    # a claim after it sees the request. What is read below is read under that lock.
    run = take_run(session, run_id, now, cancel_requested_at=now)
    if run is None:
        return Done(None)
    if owner is not None:
        run = ownership.mine(run, run_id, owner)
    if run.status != RunStatus.CANCELLING:
        deadline = deadlines.for_run(
            settings,
            run,
            heartbeat_at=run.heartbeat_at or run.created_at,
            status=RunStatus.CANCELLING,
            now=now,
        )
        transition_run(
            session,
            run_id,
            RunStatus.CANCELLING,
            cause=f"cancel requested by {by}",
            now=now,
            values={"deadline_at": deadline},
        )
    branches = closing.live_branches(session, run_id)
    in_flight = _in_flight(session, settings, run_id, now)
    if not stop or branches or in_flight:
        return Done(Requested(branches, in_flight))
    # No start can begin from the request's commit on, and none was in flight: the turns
    # read now are all the run will have, as ``finish``'s own read would find them.
    live = turns.live_turns(session, run)
    return Done(Requested(branches, in_flight, live), Followups(revoke=tuple(run.task_ids)))


def finish(
    transact: Transact,
    settings: Settings,
    run_id: str,
    *,
    now: datetime,
    stop_reason: StopReason,
    cause: str,
    revoke: bool,
    lock_timeout: float | None = None,
    inline: bool = True,
    live: list[turns.LiveTurn] | None = None,
) -> bool:
    """Stop the run's tasks and provider turns and write the terminal ``cancelled`` rows.

    The provider cancels are tried once, within ``ORCH_CANCEL_CALL_TIMEOUT`` for all turns
    together; a turn not stopped in that time is recorded ``pending`` and stopped by the
    stop task after this returns, so a hanging provider cannot hold a cancel. The sweeper
    passes ``inline=False``: every stop is handed off, none runs in its pass. ``revoke`` is
    false when the caller is the run's own step task. ``live``: the turns :func:`request`
    read under its lock (having revoked the run's tasks), instead of a read here. Returns
    ``False`` when another writer ended the run first (that writer's end stands).
    """
    if live is None:
        live = _read_live(
            transact,
            settings,
            run_id,
            now=now,
            cause=cause,
            revoke=revoke,
            lock_timeout=lock_timeout,
            inline=inline,
        )
    if live is None:
        return False
    if inline:
        results = turns.stop_within(settings, live, settings.cancel_call_timeout)
    else:
        results = turns.pending(live)
    errors = [f"{r.turn.ref.key}: {r.error}" for r in results if r.error]
    note = f"; provider cancel errors: {'; '.join(errors)}" if errors else ""

    def close(session: Session) -> Done[bool]:
        then = closing.end_run(
            session,
            settings,
            run_id,
            RunStatus.CANCELLED,
            stop_reason=stop_reason,
            cause=cause + note,
            now=now,
            revoke=False,
            stops=results,
            stop_attempts=1 if inline else 0,
        )
        return Done(True, then)

    try:
        return transact(close, lock_timeout=lock_timeout)
    except IllegalTransition:
        return False


def _read_live(
    transact: Transact,
    settings: Settings,
    run_id: str,
    *,
    now: datetime,
    cause: str,
    revoke: bool,
    lock_timeout: float | None,
    inline: bool,
) -> list[turns.LiveTurn] | None:
    """The run's live turns, read once its live branch runs have ended (each as
    :func:`finish` ends it); ``None`` when the run itself has ended."""
    live = transact(lambda session: _live(session, run_id, revoke=revoke, branches=True))
    if not isinstance(live, tuple):
        return live
    for branch in live:
        finish(
            transact,
            settings,
            branch,
            now=now,
            stop_reason=StopReason.PARENT_ENDED,
            cause=f"{cause} (its parent run)",
            revoke=True,
            lock_timeout=lock_timeout,
            inline=inline,
        )
    ended = transact(lambda session: _live(session, run_id, revoke=revoke, branches=False))
    assert not isinstance(ended, tuple)
    return ended


def _live(
    session: Session, run_id: str, *, revoke: bool, branches: bool
) -> Done[list[turns.LiveTurn] | tuple[str, ...] | None]:
    """The live turns of the run, its tasks revoked as soon as this read commits (before
    the provider cancels: a step task woken by its provider's answer must not race the cancel
    to the terminal row); ``None`` when it has ended. With ``branches``, its live branch runs
    instead, if it has any: they are ended first."""
    run = session.get(Run, run_id, options=[defer(Run.workflow)])
    if run is None or run.status in RUN_TERMINAL:
        return Done(None)
    if branches and (live_branches := closing.live_branches(session, run_id)):
        return Done(live_branches)
    then = Followups(revoke=tuple(run.task_ids)) if revoke else Followups()
    return Done(turns.live_turns(session, run), then)


def stated_bound(settings: Settings) -> float:
    """The longest ``cancel`` takes to return, in seconds, whatever the providers do: a start
    in flight holds the run row for at most one provider call, the inline cancels share
    ``ORCH_CANCEL_CALL_TIMEOUT``, and the margin covers the database writes."""
    return settings.provider_timeout + settings.cancel_call_timeout + MARGIN_SECONDS


def _await_starts(transact: Transact, settings: Settings, run_id: str, now: datetime) -> None:
    """Wait until no provider start of the run is in flight: a start claimed before the cancel
    request committed either records its turn (so it is stopped next) or ends by its hard
    deadline. A claim older than one provider call plus margin belongs to a dead worker and is
    not waited for (its turn, if any, is stopped by its key)."""
    window = turns.claim_window(settings)
    until = time.monotonic() + window.total_seconds()
    while True:
        in_flight = transact(lambda session: Done(_in_flight(session, settings, run_id, now)))
        if not in_flight or time.monotonic() >= until:
            return
        # Observing a bounded call end, not ordering two writers: the claim is the order.
        time.sleep(_START_POLL_SECONDS)


def _in_flight(session: Session, settings: Settings, run_id: str, now: datetime) -> bool:
    """Whether a step of the run holds a start claim younger than the claim window."""
    claimed = (
        select(Step.pk)
        .where(
            Step.run_id == run_id,
            constant_in(Step.status, STEP_LIVE),
            Step.start_claimed_at > now - turns.claim_window(settings),
        )
        .limit(1)
    )
    return session.scalar(claimed) is not None
