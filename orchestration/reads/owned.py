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
    if not isinstance(run_id, str) or len(run_id) > 64:
        raise RunNotFound(str(run_id)[:64])
    run = session.get(Run, run_id)
    if run is None or run.owner != owner:
        raise RunNotFound(run_id)
    return run


def record(session: Session, settings: Settings, run: Run, now: datetime) -> RunRecord:
    """The record of ``run`` at ``now``: its steps, branch runs and reruns."""
    steps = list(
        session.scalars(select(Step).where(Step.run_id == run.id).order_by(Step.index)).all()
    )
    reruns = list(
        session.scalars(
            select(Run.id).where(Run.rerun_of == run.id).order_by(Run.created_at, Run.id)
        )
    )
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
