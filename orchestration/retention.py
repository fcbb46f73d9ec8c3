"""Retention: runs that ended before a cutoff are deleted with everything that belongs to them
(steps, journal events, effects, checkpoints and branch runs), in bounded batches.

Each batch is one transaction: it picks at most ``batch`` runs that ended before the cutoff,
through the ``ix_runs_finished`` index, and deletes their rows, child tables first (so no
foreign-key cascade is needed, on either database). A batch locks only the rows it deletes:
terminal is final, so no writer waits for them, and a live run is never touched. A branch run
goes with its parent (the parent's join reads it), and a run is kept while one of its branch
runs, or a rerun of it, is live. Between batches the sweeper, the steps and ``/metrics`` carry on.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from sqlalchemy import delete, exists, func, select
from sqlalchemy.orm import Session, aliased

from orchestration.followups import Done, Transact
from orchestration.models import Checkpoint, Effect, Run, RunEvent, Step
from orchestration.states import RUN_LIVE, RUN_TERMINAL

#: Runs one batch deletes at most (with their branch runs).
DEFAULT_BATCH = 500

_TERMINAL = [status.value for status in RUN_TERMINAL]
_LIVE = [status.value for status in RUN_LIVE]
#: Every table that holds a run's rows, deleted in this order before the runs themselves.
_CHILDREN = (RunEvent, Effect, Checkpoint, Step)


def _prunable(cutoff: datetime) -> Any:
    """The condition on ``runs``: ended before ``cutoff``, not a branch run, and neither a
    live branch run nor a live rerun points at it."""
    other = aliased(Run)
    return (
        Run.finished_at < cutoff,
        Run.status.in_(_TERMINAL),
        Run.parent_run_id.is_(None),
        ~exists().where(other.parent_run_id == Run.id, other.status.in_(_LIVE)),
        ~exists().where(other.rerun_of == Run.id, other.status.in_(_LIVE)),
    )


def count(session: Session, cutoff: datetime) -> dict[str, int]:
    """What a prune at ``cutoff`` would delete (``--dry-run``)."""
    ids = select(Run.id).where(*_prunable(cutoff))
    branch_ids = select(Run.id).where(Run.parent_run_id.in_(ids))
    every = ids.union_all(branch_ids).subquery()
    counted = {
        "runs": session.scalar(select(func.count()).select_from(ids.subquery())) or 0,
        "branch_runs": session.scalar(select(func.count()).select_from(branch_ids.subquery())) or 0,
    }
    for model in _CHILDREN:
        counted[model.__tablename__] = (
            session.scalar(
                select(func.count()).select_from(model).where(model.run_id.in_(select(every.c.id)))
            )
            or 0
        )
    return counted


def delete_batch(session: Session, cutoff: datetime, batch: int) -> dict[str, int]:
    """Delete at most ``batch`` prunable runs (oldest first) and all their rows."""
    ids = list(
        session.scalars(
            select(Run.id).where(*_prunable(cutoff)).order_by(Run.finished_at).limit(batch)
        )
    )
    if not ids:
        return {"runs": 0}
    branch_ids = list(session.scalars(select(Run.id).where(Run.parent_run_id.in_(ids))))
    every = ids + branch_ids
    deleted = {"runs": len(ids), "branch_runs": len(branch_ids)}
    for model in _CHILDREN:
        done = session.execute(
            delete(model)
            .where(model.run_id.in_(every))
            .execution_options(synchronize_session=False)
        )
        deleted[model.__tablename__] = int(done.rowcount or 0)  # type: ignore[attr-defined]
    for chunk in (branch_ids, ids):  # a branch run's row points at its parent's
        if chunk:
            session.execute(
                delete(Run).where(Run.id.in_(chunk)).execution_options(synchronize_session=False)
            )
    return deleted


def prune(
    transact: Transact,
    *,
    cutoff: datetime,
    batch: int = DEFAULT_BATCH,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Delete every run that ended before ``cutoff`` in batches of ``batch`` runs, each batch
    its own transaction; with ``dry_run``, count them and delete nothing."""
    started = time.perf_counter()
    report: dict[str, Any] = {"cutoff": cutoff.isoformat(), "dry_run": dry_run, "batches": 0}
    if dry_run:
        report.update(transact(lambda session: Done(count(session, cutoff))))
    else:
        totals: dict[str, int] = {}
        while True:
            deleted = transact(lambda session: Done(delete_batch(session, cutoff, batch)))
            if not deleted["runs"]:
                break
            report["batches"] += 1
            for key, value in deleted.items():
                totals[key] = totals.get(key, 0) + value
        report.update({"runs": 0, **totals})
    report["seconds"] = round(time.perf_counter() - started, 4)
    return report
