"""A start whose run moved on while the provider call was in flight: its claim is given back,
and its turn handed to whoever stops it, without touching another execution's claim."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from orchestration.core.followups import Done, Transact
from orchestration.core.settings import Settings
from orchestration.core.states import STEP_TERMINAL
from orchestration.execution.rows import step_of
from orchestration.execution.starting import StartCall
from orchestration.limits import bounds
from orchestration.providers.base import ENDED, TurnRef, TurnStatus
from orchestration.runs import turns
from orchestration.runs.transitions import touch_step


def release_refused_start(
    settings: Settings,
    transact: Transact,
    now: datetime,
    run_id: str,
    index: int,
    call: StartCall,
    provider_run_id: str | None,
    observed: TurnStatus | None = None,
) -> None:
    """The run moved on while its turn was starting. If the step is still live and still
    holds this execution's claim (a cancel is waiting for it), hand it the turn's id and
    clear the claim: the canceller stops the turn. If the run already ended, or a newer
    attempt holds the step, this execution alone knows the turn's id, so it stops the turn
    itself (a chaos partition showed a stale execution clearing a newer claim), unless the
    step has recorded that turn since, or the status call right after the start
    (``observed``) found it ended: then it writes and stops nothing."""
    fit = provider_run_id is not None and bounds.provider_id(provider_run_id, settings)
    known = None if fit else provider_run_id

    def release(session: Session) -> Done[int | None]:
        step = step_of(session, run_id, index)
        if step is None:
            return Done(None)
        if step.idempotency_key == call.request.key and step.provider_run_id is not None:
            # The step already holds this very turn (one key, one turn): the execution that
            # recorded it owns it, and has finished or will stop it. Nothing is this stale
            # execution's to write (a chaos partition showed it stopping a turn, and writing
            # the step, after a re-armed execution had completed the run with that turn).
            return Done(None)
        if step.start_claimed_at != call.claimed_at and step.status not in STEP_TERMINAL:
            # Another execution claimed the start since: its claim is not this one's to
            # clear. The same key is the same turn, which it records; a newer attempt's key
            # makes this turn an orphan, which this execution stops.
            return Done(None if step.idempotency_key == call.request.key else step.pk)
        if touch_step(session, step, now, start_claimed_at=None, provider_run_id=known):
            return Done(None)
        return Done(step.pk)

    pk = transact(release)
    if pk is None or known is None:
        return
    if observed is not None and observed.status in ENDED:
        # A turn that has ended has nothing to stop, and the step this execution no longer
        # owns is not its to write (chaos, a one-way cut: a retried step's stale attempt,
        # whose failure the re-armed execution had already seen, wrote its stop there).
        return
    ref = TurnRef(call.request.key, known, call.request.options)
    turn = turns.LiveTurn(run_id, index, pk, call.provider, ref)
    result = turns.stop_once(settings, turn)
    transact(lambda session: Done(None, turns.hand_off(session, [result], now, attempts=1)))
