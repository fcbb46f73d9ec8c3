"""The decisions every execution starts with, each written once as a piece of SQL.

* **The fence**: ``UPDATE steps SET polls = tick + 1 WHERE polls = tick``: of two deliveries
  of one message exactly one proceeds.
* **The start claim**: whether a step's provider start may be claimed now
  (:func:`refusal`, ``NULL`` when it may) and what claiming writes (the step to ``running``,
  its rendered input, ``start_claimed_at``). The fence can carry the claim (a task rendered
  before the fence), or the claim follows it (:data:`CLAIM`, a task rendered from the run's
  data); both apply the same expressions.
* **The stamp**: the heartbeat and the deadline of a running run with no cancel requested,
  written only when the fence took; it returns the execution's phase (:func:`phase`).

:mod:`orchestration.core.pieces` sends them, as one statement or in sequence. Every parameter is
named ``b_…``: a parameter named after a column of an updated table would be taken as a
value to set.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Table,
    Update,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy import String as SqlString

from orchestration.core import deadlines
from orchestration.core.db import constant, constant_in, json_text
from orchestration.core.models import Run, Step
from orchestration.core.pieces import Piece
from orchestration.core.settings import Settings
from orchestration.core.states import (
    STEP_LIVE,
    UNATTENDED_PARKS,
    RunStatus,
    StepStatus,
    TurnStopStatus,
)
from orchestration.limits import admission
from orchestration.runs import turns

STEPS: Table = Step.__table__  # type: ignore[assignment]
RUNS: Table = Run.__table__  # type: ignore[assignment]

#: The run statuses in which a step's turn may start.
STARTABLE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.PARKED)
#: The step statuses that a claim moves to ``running``; a running or parked step that has
#: no turn (its start failed to reach the provider) is claimed where it is.
_STARTS_ATTEMPT = (StepStatus.PENDING, StepStatus.RETRYING)


class Phase(StrEnum):
    """What an execution does after its fence."""

    START = "start"
    POLL = "poll"
    EFFECTS = "effects"
    HUMAN = "human"
    CANCEL = "cancel"


class Refusal(StrEnum):
    """Why a step's start may not be claimed now."""

    #: Its turn started: the execution polls it.
    HAS_TURN = "has_turn"
    #: Another execution's claim is younger than the claim window: its start is in flight.
    IN_FLIGHT = "in_flight"
    #: A retrying step's backoff runs until ``retry_at``.
    BACKOFF = "backoff"
    #: The previous attempt's turn is still being stopped.
    STOPPING = "stopping"
    #: The previous attempt's turn could not be stopped: a second must not run beside it.
    UNSTOPPABLE = "unstoppable"
    #: The run is not in a status a turn may start in, or a cancel is requested.
    RUN = "run"
    #: The run's owner has as many live provider turns as its budget
    #: (``ORCH_MAX_LIVE_TURNS_PER_OWNER``, or the owner's own value): it waits for one to end.
    TURNS = "turns"


def _startable_run(run_id: ColumnElement[Any]) -> ColumnElement[bool]:
    return (
        exists()
        .where(
            RUNS.c.id == run_id,
            constant_in(RUNS.c.status, STARTABLE),
            RUNS.c.cancel_requested_at.is_(None),
        )
        .correlate_except(RUNS)
    )


def _turns_full(run_id: ColumnElement[Any]) -> ColumnElement[bool]:
    """The run's owner has no room for one more live turn
    (:data:`orchestration.limits.admission.LIVE_TURNS`, read last: only a start that nothing
    else refuses counts its owner's turns)."""
    return (
        exists()
        .where(RUNS.c.id == run_id, admission.full(admission.LIVE_TURNS, RUNS.c.owner))
        .correlate_except(RUNS)
    )


def refusal(steps: Any = STEPS) -> ColumnElement[str | None]:
    """Why the step may not be claimed at ``b_now`` (``NULL``: it may), over its row in
    ``steps`` (the table, or an alias of it)."""
    c = steps.c
    retrying = c.status == constant(StepStatus.RETRYING.value)

    def previous_stop(field: str) -> ColumnElement[Any]:
        return json_text(c.turn_stop, field)

    # A retrying step's stop names the previous attempt's turn; one naming this attempt's
    # key, or none (no stop: its key reads NULL), holds nothing back.
    previous = and_(
        retrying,
        func.coalesce(previous_stop("key"), c.idempotency_key) != c.idempotency_key,
    )
    # Its stop is still pending (stopping), or failed with the turn known (unstoppable).
    stopping = previous_stop("status") == constant(TurnStopStatus.PENDING.value)
    unstoppable = and_(
        previous_stop("status") == constant(TurnStopStatus.FAILED.value),
        previous_stop("provider_run_id").is_not(None),
    )
    why: ColumnElement[str | None] = case(
        (c.provider_run_id.is_not(None), constant(Refusal.HAS_TURN.value)),
        (c.start_claimed_at > bindparam("b_claim_floor"), constant(Refusal.IN_FLIGHT.value)),
        (and_(retrying, c.retry_at > bindparam("b_now")), constant(Refusal.BACKOFF.value)),
        (
            and_(previous, or_(stopping, unstoppable)),
            case(
                (stopping, constant(Refusal.STOPPING.value)),
                else_=constant(Refusal.UNSTOPPABLE.value),
            ),
        ),
        (~_startable_run(c.run_id), constant(Refusal.RUN.value)),
        (_turns_full(c.run_id), constant(Refusal.TURNS.value)),
        else_=null(),
    )
    return why


def _cause(attempt: ColumnElement[Any]) -> ColumnElement[Any]:
    return case(
        (attempt == constant(1), constant("turn starting")),
        else_=constant("attempt ") + cast(attempt, SqlString) + constant(" starting"),
    )


#: The columns a claim writes, in the order of :func:`claim_values`' row.
_CLAIM_COLUMNS = ("status", "cause", "input", "started_at", "retry_at", "start_claimed_at")


def claim_values() -> dict[Any, ColumnElement[Any]]:
    """What a claim writes, each column written only where :func:`refusal` is ``NULL``.

    One row assigned to the columns together, from a sub-select that judges the refusal
    once (a ``CASE`` per column would judge it, and count the owner's live turns, per
    column). The sub-select reads the updated row, so on PostgreSQL a row a concurrent
    writer changed is judged again as it is now, as a per-column ``CASE`` is."""
    now = bindparam("b_now", type_=STEPS.c.start_claimed_at.type)
    # OFFSET 0 keeps PostgreSQL from pulling the sub-select up into each column's CASE.
    judged = select(refusal().label("why")).correlate(STEPS).offset(constant(0)).subquery("judged")
    free = judged.c.why.is_(None)
    # Whether the claim takes, and whether it moves the step to running, judged once each.
    decided = (
        select(
            free.label("takes"),
            and_(free, constant_in(STEPS.c.status, _STARTS_ATTEMPT)).label("moves"),
        )
        .select_from(judged)
        .correlate(STEPS)
        .subquery("claim")
    )
    takes, moves = decided.c.takes, decided.c.moves

    def moved(value: Any, column: str) -> ColumnElement[Any]:
        return case((moves, value), else_=STEPS.c[column])

    row = (
        select(
            moved(constant(StepStatus.RUNNING.value), "status"),
            moved(_cause(STEPS.c.attempt), "cause"),
            moved(bindparam("b_input", type_=STEPS.c.input.type), "input"),
            moved(func.coalesce(STEPS.c.started_at, now), "started_at"),
            moved(null(), "retry_at"),
            case((takes, now), else_=STEPS.c.start_claimed_at),
        )
        .select_from(decided)
        .correlate(STEPS)
        .scalar_subquery()
    )
    return {tuple_(*(STEPS.c[name] for name in _CLAIM_COLUMNS)): row}


#: The step row again, for what is judged of it in ``RETURNING``: SQLite (3.40) evaluates an
#: ``IS NULL`` of the updated row's own columns there wrongly, a subquery's rightly. On
#: PostgreSQL the subquery reads the row as the statement found it, on SQLite as written: the
#: same for every column judged but those a claim writes, and a claim is ``claimed``.
_JUDGED = STEPS.alias("judged")


#: The updated row's key, qualified: ``RETURNING`` writes its columns bare, and a bare ``pk``
#: inside the subquery would be the alias's own.
_UPDATED_PK = literal_column("steps.pk", Integer)


def _judged(expression: ColumnElement[Any]) -> ColumnElement[Any]:
    return select(expression).where(_JUDGED.c.pk == _UPDATED_PK).scalar_subquery()


#: Whether this execution's statement claimed the start (a claimed step is refused nothing,
#: and its refusal is not judged again).
_CLAIMED = STEPS.c.start_claimed_at == bindparam("b_now")


def _unless_claimed(refused: ColumnElement[Any]) -> ColumnElement[Any]:
    """``refused``, judged only for a step this execution did not claim."""
    return case((_CLAIMED, null()), else_=refused)


#: The step this execution fenced, as a later statement of the execution finds it (``b_pk``
#: at ``b_tick + 1``): a newer delivery's fence has moved the tick on.
_STILL_FENCED = (
    STEPS.c.pk == bindparam("b_pk"),
    STEPS.c.polls == bindparam("b_tick", type_=Integer) + constant(1),
)

#: The step as the execution reads it.
_STEP = (
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
#: What the fence and the claim return: the step, why it may not be claimed (``refused``),
#: and whether this execution claimed it.
RETURNED = (
    *_STEP,
    _unless_claimed(_judged(refusal(_JUDGED))).label("refused"),
    _CLAIMED.label("claimed"),
)
#: What a fence sent with no transaction around it returns: the refusal is not judged (a
#: poll, the most frequent execution, never needs it, and a statement that holds it pays
#: for its plan at every execution), but in the transaction that follows (:data:`JUDGE`).
_RETURNED_UNJUDGED = (*_STEP, null().label("refused"), _CLAIMED.label("claimed"))

_FENCE = update(STEPS).where(
    STEPS.c.run_id == bindparam("b_run"),
    STEPS.c.index == bindparam("b_index"),
    STEPS.c.polls == bindparam("b_tick"),
    constant_in(STEPS.c.status, STEP_LIVE),
)
_FENCED = {
    "polls": bindparam("b_tick", type_=Integer) + constant(1),
    "worker": bindparam("b_worker"),
    "worker_pid": bindparam("b_pid"),
    "updated_at": bindparam("b_now"),
}
#: The fence alone, judging the refusal of the step it fenced.
FENCE: Update = _FENCE.values(_FENCED).returning(*RETURNED)
#: The fence alone, the refusal left to :data:`JUDGE`.
FENCE_UNJUDGED: Update = _FENCE.values(_FENCED).returning(*_RETURNED_UNJUDGED)
#: The fence carrying the claim of a task rendered before it (``b_input``); a claim it did
#: not take is judged by :data:`JUDGE` (twice in one statement, it would be over psycopg's
#: 4 KiB and parsed again at every execution).
FENCE_AND_CLAIM: Update = _FENCE.values({**_FENCED, **claim_values()}).returning(
    *_RETURNED_UNJUDGED
)
#: Why the step an unjudged fence fenced may not be claimed now, read in the transaction
#: that stamped its run, the step held until the commit.
JUDGE = (
    select(_unless_claimed(refusal()).label("refused"))
    .where(*_STILL_FENCED)
    .with_for_update(of=STEPS, key_share=True)
)
#: The claim after the fence, on the step this execution fenced.
CLAIM: Update = (
    update(STEPS)
    .where(*_STILL_FENCED)
    .values({**claim_values(), "updated_at": bindparam("b_now")})
    .returning(*RETURNED)
)


def phase(
    step_status: ColumnElement[Any],
    provider_run_id: ColumnElement[Any],
    run_status: ColumnElement[Any],
    park_reason: ColumnElement[Any],
    current_step: ColumnElement[Any],
) -> ColumnElement[Any]:
    """What the execution of step ``b_index`` does, over its step's and its run's columns."""
    return case(
        (
            and_(
                run_status == constant(RunStatus.WAITING.value),
                current_step == bindparam("b_index"),
            ),
            constant(Phase.EFFECTS.value),
        ),
        (
            and_(
                step_status == constant(StepStatus.PARKED.value),
                constant_in(func.coalesce(park_reason, constant("")), UNATTENDED_PARKS),
            ),
            constant(Phase.HUMAN.value),
        ),
        (
            or_(step_status == constant(StepStatus.PENDING.value), provider_run_id.is_(None)),
            constant(Phase.START.value),
        ),
        else_=constant(Phase.POLL.value),
    )


#: The phase of a run row being written, judged over its step's row in one subquery.
RUN_PHASE = (
    select(
        phase(
            STEPS.c.status,
            STEPS.c.provider_run_id,
            RUNS.c.status,
            RUNS.c.park_reason,
            RUNS.c.current_step,
        )
    )
    .where(STEPS.c.run_id == RUNS.c.id, STEPS.c.index == bindparam("b_index"))
    .correlate(RUNS)
    .scalar_subquery()
)


@functools.lru_cache(maxsize=16)
def stamp(statuses: tuple[RunStatus, ...]) -> Update:
    """The stamp of a run in one of ``statuses`` with no cancel requested: its heartbeat,
    the step it is on and its deadline (``b_deadline``); it returns the phase."""
    return (
        update(RUNS)
        .where(
            RUNS.c.id == bindparam("b_run"),
            constant_in(RUNS.c.status, statuses),
            RUNS.c.cancel_requested_at.is_(None),
        )
        .values(
            heartbeat_at=bindparam("b_now"),
            current_step=bindparam("b_index"),
            updated_at=bindparam("b_now"),
            deadline_at=bindparam("b_deadline"),
        )
        .returning(RUN_PHASE.label("phase"))
    )


#: The stamp of a running run: after the fence, only when it took.
STAMP_RUNNING = stamp((RunStatus.RUNNING,))

#: The entry's pieces: the fence, then the stamp of a running run.
ENTER = (Piece("fenced", FENCE), Piece("stamped", STAMP_RUNNING, after="fenced"))
#: The same with the refusal left to :data:`JUDGE`.
ENTER_UNJUDGED = (
    Piece("fenced", FENCE_UNJUDGED),
    Piece("stamped", STAMP_RUNNING, after="fenced"),
)
#: The same, the fence carrying the claim.
ENTER_AND_CLAIM = (
    Piece("fenced", FENCE_AND_CLAIM),
    Piece("stamped", STAMP_RUNNING, after="fenced"),
)


def params(
    settings: Settings,
    run_id: str,
    index: int,
    tick: int,
    now: datetime,
    worker: str | None,
    pid: int | None,
    *,
    deadline: datetime | None = None,
) -> dict[str, Any]:
    """The bound values of the entry's pieces; the deadline is the one a heartbeat at
    ``now`` gives a running run unless given."""
    if deadline is None:
        deadline = deadlines.compute(settings, RunStatus.RUNNING, heartbeat_at=now)
    window: timedelta = turns.claim_window(settings)
    return {
        "b_run": run_id,
        "b_index": index,
        "b_tick": tick,
        "b_worker": worker,
        "b_pid": pid,
        "b_now": now,
        "b_deadline": deadline,
        "b_claim_floor": now - window,
        **admission.limits(settings, (admission.LIVE_TURNS,)),
    }
