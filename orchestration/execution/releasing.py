"""A start whose run moved on while the provider call was in flight: its claim is given back,
and its turn handed to whoever stops it, without touching another execution's claim."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Table, bindparam, update
from sqlalchemy.orm import Session

from orchestration.core.db import constant_in
from orchestration.core.followups import Done, Transact
from orchestration.core.models import Step
from orchestration.core.settings import Settings
from orchestration.core.states import STEP_LIVE, STEP_TERMINAL
from orchestration.execution.rows import step_of
from orchestration.execution.starting import StartCall
from orchestration.limits import bounds
from orchestration.providers.base import ENDED, TurnRef, TurnStatus
from orchestration.runs import turns

_STEPS: Table = Step.__table__  # type: ignore[assignment]

#: The hand-off: the turn's id to the step and its claim cleared, only while the live step
#: still holds this execution's claim (``b_claimed``). The claim is judged in the statement's
#: own ``WHERE`` on the row it writes, so PostgreSQL judges it again on the row's latest
#: version when the statement waited on its lock: a claim committed meanwhile by a newer
#: execution is never cleared (a read, then a write guarded by the status alone, cleared it).
HAND_OFF = (
    update(_STEPS)
    .where(
        _STEPS.c.pk == bindparam("b_pk"),
        _STEPS.c.start_claimed_at == bindparam("b_claimed"),
        constant_in(_STEPS.c.status, [status.value for status in STEP_LIVE]),
    )
    .values(
        start_claimed_at=None,
        provider_run_id=bindparam("b_turn"),
        updated_at=bindparam("b_now"),
    )
    .returning(_STEPS.c.pk)
)


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
    clear the claim, in one statement guarded by that claim: the canceller stops the turn.
    The claim, not the fence's tick, is what a start holds: an execution that fenced the
    step since found the claim live and only polls (``Refusal.IN_FLIGHT``). If the run
    already ended, or a newer attempt holds the step, this execution alone knows the turn's
    id, so it stops the turn itself (a chaos partition showed a stale execution clearing a
    newer claim), unless the step has recorded that turn since, or the status call right
    after the start (``observed``) found it ended: then it writes and stops nothing."""
    fit = provider_run_id is not None and bounds.provider_id(provider_run_id, settings)
    known = None if fit else provider_run_id

    def holds_turn(step: Step) -> bool:
        # The step already holds this very turn (one key, one turn): the execution that
        # recorded it owns it, and has finished or will stop it. Nothing is this stale
        # execution's to write (a chaos partition showed it stopping a turn, and writing
        # the step, after a re-armed execution had completed the run with that turn).
        return step.idempotency_key == call.request.key and step.provider_run_id is not None

    def release(session: Session) -> Done[int | None]:
        step = step_of(session, run_id, index)
        if step is None or holds_turn(step):
            return Done(None)
        bound = {"b_pk": step.pk, "b_claimed": call.claimed_at, "b_turn": known, "b_now": now}
        if session.execute(HAND_OFF, bound).first() is not None:
            return Done(None)
        step = step_of(session, run_id, index)
        if step is None or holds_turn(step):
            return Done(None)
        if step.status in STEP_TERMINAL:
            # The run ended without this turn: this execution alone knows it, and stops it.
            return Done(step.pk)
        # Another execution claimed the start since: its claim is not this one's to clear.
        # The same key is the same turn, which it records; a newer attempt's key makes this
        # turn an orphan, which this execution stops.
        return Done(None if step.idempotency_key == call.request.key else step.pk)

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
