"""A run's health and the judgements it is made of, written once, in SQL over the run's columns.

``working``: live and its heartbeat is fresh. ``waiting``: parked within its budget (a polled
park also needs a fresh heartbeat: a park never hides a dead run), or queued behind a key's
holder or for a branch slot. ``stalled``: a dead heartbeat or a park past its budget.
``ended``: terminal. Every bound is turned into a cut-off time computed here, so the SQL
compares columns with parameters and does no date arithmetic (the same on PostgreSQL and
SQLite); the expressions are built once and bound with :func:`params`. A list filters on
:func:`expression`; a record, a launch, ``claims``, the sweeper's rules and ``explain`` read
the same expressions (:func:`judge`), never a Python copy of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Table, and_, bindparam, case, func, or_, select
from sqlalchemy.orm import Session

from orchestration.core.db import constant, constant_in
from orchestration.core.models import Run
from orchestration.core.settings import Settings
from orchestration.core.states import (
    RUN_TERMINAL,
    UNATTENDED_PARKS,
    ConcurrencyState,
    Health,
    ParkReason,
    RunStatus,
)

_RUNS: Table = Run.__table__  # type: ignore[assignment]
_KNOWN = [reason.value for reason in ParkReason]
#: The run's columns the judgements read, by default the table's (``c``: any object with
#: these columns, such as the columns a statement returned).
Columns = Any


def params(settings: Settings, now: datetime) -> dict[str, datetime]:
    """The bound values of every judgement at ``now``: each bound turned into a cut-off."""
    bound = {"h_now": now, "h_beat": now - timedelta(seconds=settings.heartbeat_timeout)}
    for reason in (*_KNOWN, None):
        name = f"h_park_{reason or 'other'}"
        bound[name] = now - timedelta(seconds=settings.park_budget(reason))
    return bound


def _cut(name: str) -> Any:
    return bindparam(name, type_=_RUNS.c.created_at.type)


def heartbeat_dead(c: Columns = _RUNS.c) -> ColumnElement[bool]:
    """The run's last stamp is older than ``ORCH_HEARTBEAT_TIMEOUT``."""
    dead: ColumnElement[bool] = func.coalesce(c.heartbeat_at, c.created_at) < _cut("h_beat")
    return dead


def _timed_approval(c: Columns) -> ColumnElement[bool]:
    """The park is an approval with an expiry (``expires_in``); never ``NULL``, so that its
    negation holds for every other park."""
    return and_(
        func.coalesce(c.park_reason, constant("")) == constant(ParkReason.APPROVAL.value),
        c.waiting_until.is_not(None),
    )


def approval_expired(c: Columns = _RUNS.c) -> ColumnElement[bool]:
    """The run waits on an approval whose ``expires_in`` is up."""
    return and_(
        c.status == constant(RunStatus.PARKED.value),
        _timed_approval(c),
        c.cancel_requested_at.is_(None),
        c.waiting_until <= _cut("h_now"),
    )


def park_expired(c: Columns = _RUNS.c) -> ColumnElement[bool]:
    """A parked run is past its budget and any later ``waiting_until``; an approval with an
    expiry ends at that expiry exactly (``deadlines.park_expiry`` states the same instant)."""
    now = _cut("h_now")
    over_budget = or_(
        *(
            and_(c.park_reason == constant(reason), c.parked_since < _cut(f"h_park_{reason}"))
            for reason in _KNOWN
        ),
        and_(
            or_(c.park_reason.is_(None), ~constant_in(c.park_reason, _KNOWN)),
            c.parked_since < _cut("h_park_other"),
        ),
    )
    timed_approval = _timed_approval(c)
    return and_(
        c.status == constant(RunStatus.PARKED.value),
        c.parked_since.is_not(None),
        or_(
            and_(timed_approval, c.waiting_until < now),
            and_(
                ~timed_approval,
                over_budget,
                or_(c.waiting_until.is_(None), c.waiting_until < now),
            ),
        ),
    )


def expression(c: Columns = _RUNS.c) -> ColumnElement[str]:
    """A run's health (at ``h_now``, :func:`params`)."""
    polled_park_dead = and_(
        or_(c.park_reason.is_(None), ~constant_in(c.park_reason, UNATTENDED_PARKS)),
        heartbeat_dead(c),
    )
    parked = c.status == constant(RunStatus.PARKED.value)
    health: ColumnElement[str] = case(
        (constant_in(c.status, RUN_TERMINAL), constant(Health.ENDED.value)),
        (
            and_(parked, or_(park_expired(c), polled_park_dead)),
            constant(Health.STALLED.value),
        ),
        (parked, constant(Health.WAITING.value)),
        (
            and_(
                c.status == constant(RunStatus.QUEUED.value),
                constant_in(c.concurrency, (ConcurrencyState.QUEUED, ConcurrencyState.SLOT)),
            ),
            constant(Health.WAITING.value),
        ),
        (heartbeat_dead(c), constant(Health.STALLED.value)),
        else_=constant(Health.WORKING.value),
    )
    return health


@dataclass(frozen=True)
class Judged:
    """What the SQL judged of one run at one instant."""

    health: Health
    heartbeat_dead: bool
    park_expired: bool
    approval_expired: bool


#: The columns :class:`Judged` is read from, to select beside a run (with :func:`params`).
JUDGEMENTS = (
    expression().label("j_health"),
    heartbeat_dead().label("j_heartbeat_dead"),
    park_expired().label("j_park_expired"),
    approval_expired().label("j_approval_expired"),
)
_JUDGE = select(*JUDGEMENTS).where(_RUNS.c.id == bindparam("h_run"))


def judged(row: Any) -> Judged:
    """:class:`Judged` from a row that selected :func:`judgements`."""
    return Judged(
        Health(row.j_health),
        bool(row.j_heartbeat_dead),
        bool(row.j_park_expired),
        bool(row.j_approval_expired),
    )


def judge(session: Session, settings: Settings, run_id: str, now: datetime) -> Judged | None:
    """What the SQL judges of run ``run_id`` at ``now`` (``None``: no such run)."""
    row = session.execute(_JUDGE, {**params(settings, now), "h_run": run_id}).first()
    return None if row is None else judged(row)
