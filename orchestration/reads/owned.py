"""The reads of one owner's run that the service's calls share: the run itself, its record
and its journal, each inside the caller's transaction.

Another owner's run is :class:`RunNotFound`, exactly like a missing one (invariant 7,
:mod:`orchestration.core.ownership`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from orchestration.core import health, ownership
from orchestration.core.models import Run, RunEvent, Step
from orchestration.core.settings import Settings
from orchestration.execution import branching
from orchestration.reads.records import RunRecord, to_record


def owned(session: Session, run_id: str, owner: str) -> Run:
    """The run ``run_id`` of ``owner``. Raises :class:`RunNotFound` for a missing run, a run
    of another owner, or an id that cannot be one (not text, over 64 characters)."""
    return ownership.mine(session.get(Run, ownership.checked(run_id)), run_id, owner)


#: Built once: building its judgements' expressions again at each call cost as much CPU as
#: the statement's round trip.
_JUDGED = select(Run, *health.JUDGEMENTS).where(Run.id == bindparam("h_run"))


def owned_judged(
    session: Session, settings: Settings, run_id: str, owner: str, now: datetime
) -> tuple[Run, health.Judged]:
    """:func:`owned`, with what the SQL judges of the run at ``now``, in the same statement."""
    row = session.execute(
        _JUDGED, {**health.params(settings, now), "h_run": ownership.checked(run_id)}
    ).first()
    return ownership.mine(None if row is None else row[0], run_id, owner), health.judged(row)


def record(
    session: Session,
    settings: Settings,
    run: Run,
    now: datetime,
    judged: health.Judged | None = None,
) -> RunRecord:
    """The record of ``run`` at ``now``: its steps, branch runs and reruns; its health as
    ``judged`` (read with the run by :func:`owned_judged`), else judged here."""
    steps = list(
        session.scalars(select(Step).where(Step.run_id == run.id).order_by(Step.index)).all()
    )
    reruns = list(
        session.scalars(
            select(Run.id).where(Run.rerun_of == run.id).order_by(Run.created_at, Run.id)
        )
    )
    if judged is None:
        judged = health.judge(session, settings, run.id, now)
        assert judged is not None
    return to_record(
        settings,
        run,
        steps,
        now,
        branches=branching.listed(session, run.id),
        reruns=reruns,
        health=judged.health,
    )


def journal(session: Session, run_id: str, owner: str) -> list[dict[str, Any]]:
    """The journal of the owner's run, oldest first. Raises :class:`RunNotFound`."""
    owned(session, run_id, owner)
    rows = session.scalars(
        select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.id)
    ).all()
    return [
        {
            "step_id": row.step_id,
            "from": row.from_status,
            "to": row.to_status,
            "cause": row.cause,
            "stop_reason": row.stop_reason,
            "at": row.at,
        }
        for row in rows
    ]
