"""The reads of one owner's run that the service's calls share: the run itself, its record
and its journal, each inside the caller's transaction.

Another owner's run is :class:`RunNotFound`, exactly like a missing one (invariant 7), so
every call that names a run goes through :func:`owned` first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core import health
from orchestration.core.errors import RunNotFound
from orchestration.core.models import Run, RunEvent, Step
from orchestration.core.settings import Settings
from orchestration.execution import branching
from orchestration.reads.records import RunRecord, to_record


def owned(session: Session, run_id: str, owner: str) -> Run:
    """The run ``run_id`` of ``owner``. Raises :class:`RunNotFound` for a missing run, a run
    of another owner, or an id that cannot be one (not text, over 64 characters)."""
    return _mine(session.get(Run, _checked(run_id)), run_id, owner)


def owned_judged(
    session: Session, settings: Settings, run_id: str, owner: str, now: datetime
) -> tuple[Run, health.Judged]:
    """:func:`owned`, with what the SQL judges of the run at ``now``, in the same statement."""
    row = session.execute(
        select(Run, *health.JUDGEMENTS).where(Run.id == _checked(run_id)),
        health.params(settings, now),
    ).first()
    if row is None:
        raise RunNotFound(run_id)
    return _mine(row[0], run_id, owner), health.judged(row)


def _checked(run_id: Any) -> str:
    if not isinstance(run_id, str) or len(run_id) > 64:
        raise RunNotFound(str(run_id)[:64])
    return run_id


def _mine(run: Run | None, run_id: str, owner: str) -> Run:
    if run is None or run.owner != owner:
        raise RunNotFound(run_id)
    return run


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
