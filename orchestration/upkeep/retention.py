"""Retention: runs that ended before a cutoff are deleted with everything that belongs to them
(steps, journal events, effects, checkpoints and branch runs), in bounded batches.

Each batch is one transaction: it picks at most ``batch`` runs that ended before the cutoff,
through the ``ix_runs_finished`` index, and deletes their rows, child tables first (so no
foreign-key cascade is needed, on either database), through the same pieces as an owner's
delete of one run (:mod:`orchestration.runs.deletion`, :func:`delete_owned`). A batch locks
only the rows it deletes: terminal is final, so no writer waits for them, and a live run is
never touched. A branch run goes with its parent (the parent's join reads it), and a run is
kept while one of its branch runs, or a rerun of it, is live. Between batches the sweeper,
the steps and ``/metrics`` carry on.

The artifacts the deleted steps referenced go too, once no step of their owner references
them and no store has stamped them since the cutoff (a live run storing the same bytes
again keeps them); a file in ``ORCH_ARTIFACT_DIR`` goes after the commit, when no owner's
row names it and it was not written since the cutoff. The deleted runs are added to
``run_totals`` in the same transaction, so ``/metrics`` counters never go down.

Then the ``schedule_fires`` rows recorded before the cutoff go, by their own age (a fire row
may outlive its run, which the listing shows as pruned, or go before a run that ended later),
``batch`` rows per transaction, walking the primary key so no batch reads a kept row twice.
Two rows are kept whatever their age: the latest fire of each (owner, name), which is the
schedule's cursor (without it the next pass would plan from the registration and record a
flood of ``skipped`` fires), and the fire of a run still live, which ``overlap`` reads.
"""

from __future__ import annotations

import time
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import delete, exists, func, select, tuple_
from sqlalchemy.orm import Session, aliased

from orchestration.core.followups import Done, Transact
from orchestration.core.models import Artifact, Run, ScheduleFire, Step
from orchestration.core.settings import Settings
from orchestration.core.states import RUN_LIVE, RUN_TERMINAL
from orchestration.runs import deletion
from orchestration.upkeep import pruned_counts

#: Runs one batch deletes at most (with their branch runs).
DEFAULT_BATCH = 500

_TERMINAL = [status.value for status in RUN_TERMINAL]
_LIVE = [status.value for status in RUN_LIVE]


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


def _old_fires(cutoff: datetime) -> Any:
    """The condition on ``schedule_fires``: recorded before ``cutoff``, a later fire of the
    same schedule exists (the latest is the cursor), and its run, if any, is not live."""
    later = aliased(ScheduleFire)
    return (
        ScheduleFire.recorded_at < cutoff,
        exists().where(
            later.owner == ScheduleFire.owner,
            later.name == ScheduleFire.name,
            later.fire_at > ScheduleFire.fire_at,
        ),
        ~exists().where(Run.id == ScheduleFire.run_id, Run.status.in_(_LIVE)),
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
    for model in deletion.CHILDREN:
        counted[model.__tablename__] = (
            session.scalar(
                select(func.count()).select_from(model).where(model.run_id.in_(select(every.c.id)))
            )
            or 0
        )
    kept = select(Step.output_sha256).join(Run, Run.id == Step.run_id)
    referenced = (
        select(Run.owner, Step.output_sha256)
        .join(Run, Run.id == Step.run_id)
        .where(Step.run_id.in_(select(every.c.id)), Step.output_sha256.is_not(None))
        .distinct()
        .subquery()
    )
    counted["artifacts"] = (
        session.scalar(
            select(func.count())
            .select_from(referenced)
            .where(
                ~exists(
                    kept.where(
                        Run.owner == referenced.c.owner,
                        Step.output_sha256 == referenced.c.output_sha256,
                        Step.run_id.not_in(select(every.c.id)),
                    )
                ),
                # As the delete: one stored again since the cutoff stays.
                exists().where(
                    Artifact.owner == referenced.c.owner,
                    Artifact.sha256 == referenced.c.output_sha256,
                    Artifact.used_at < cutoff,
                ),
            )
        )
        or 0
    )
    named = deletion.named_files(session, select(every.c.id))
    if named:
        # Files only the deleted runs' outputs name (one that is also an output was counted).
        counted["artifacts"] += (
            session.scalar(
                select(func.count())
                .select_from(Artifact)
                .where(
                    tuple_(Artifact.owner, Artifact.sha256).in_(named),
                    Artifact.used_at < cutoff,
                    ~deletion.kept_as_output(),
                    ~deletion.names_file(Step.run_id.not_in(select(every.c.id))),
                )
            )
            or 0
        )
    counted[ScheduleFire.__tablename__] = (
        session.scalar(select(func.count()).select_from(ScheduleFire).where(*_old_fires(cutoff)))
        or 0
    )
    return counted


def delete_batch(session: Session, cutoff: datetime, batch: int) -> dict[str, Any]:
    """Delete at most ``batch`` prunable runs (oldest first), all their rows and the
    artifacts nothing else references (``unnamed``: the hashes whose files may go)."""
    ids = list(
        session.scalars(
            select(Run.id).where(*_prunable(cutoff)).order_by(Run.finished_at).limit(batch)
        )
    )
    if not ids:
        return {"runs": 0}
    deleted = deletion.delete_rows(session, ids)
    pruned_counts.keep(session, deleted.gone)
    report: dict[str, Any] = dict(deleted.counts)
    report["artifacts"], report["unnamed"] = deletion.delete_unreferenced(
        session, deleted.candidates, files_named=deleted.files, stored_before=cutoff
    )
    return report


def delete_run(
    transact: Transact, settings: Settings, run_id: str, *, owner: str, by: str, now: datetime
) -> deletion.Deletion:
    """An owner's delete of one ended run (:func:`orchestration.runs.deletion.delete_owned`),
    one transaction in which its runs are added to the totals as a prune's are (``/metrics``
    counters never go down); then the files no row names any more. Raises what
    ``delete_owned`` raises."""
    started = time.time()

    def delete(session: Session) -> Done[deletion.Deletion]:
        done = deletion.delete_owned(session, settings, run_id, owner=owner, by=by, now=now)
        pruned_counts.keep(session, done.deleted.gone)
        return Done(done)

    done = transact(delete)
    deletion.unlink(settings.artifact_dir, done.unnamed, started)
    return done


def delete_fires(
    session: Session, *, cutoff: datetime, batch: int, after: int
) -> Done[tuple[int, int]]:
    """Delete at most ``batch`` prunable fire rows whose key is over ``after``, lowest first:
    how many, and the highest key deleted (where the next batch starts)."""
    pks = list(
        session.scalars(
            select(ScheduleFire.pk)
            .where(ScheduleFire.pk > after, *_old_fires(cutoff))
            .order_by(ScheduleFire.pk)
            .limit(batch)
        )
    )
    if pks:
        session.execute(
            delete(ScheduleFire)
            .where(ScheduleFire.pk.in_(pks))
            .execution_options(synchronize_session=False)
        )
    return Done((len(pks), pks[-1] if pks else after))


def _prune_fires(transact: Transact, cutoff: datetime, batch: int) -> tuple[int, int]:
    """Delete the prunable fire rows, a batch per transaction: how many, in how many batches."""
    deleted = batches = after = 0
    while True:
        rows, after = transact(partial(delete_fires, cutoff=cutoff, batch=batch, after=after))
        if not rows:
            return deleted, batches
        deleted, batches = deleted + rows, batches + 1


def prune(
    transact: Transact,
    *,
    cutoff: datetime,
    batch: int = DEFAULT_BATCH,
    dry_run: bool = False,
    artifact_dir: str | None = None,
) -> dict[str, Any]:
    """Delete every run that ended before ``cutoff`` in batches of ``batch`` runs, each batch
    its own transaction (then the files in ``artifact_dir`` it left unnamed), then the fire
    rows recorded before it but the kept ones, ``batch`` rows per transaction (``batches``
    counts both); with ``dry_run``, count them and delete nothing."""
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
            deletion.unlink(artifact_dir, deleted.pop("unnamed"), cutoff.timestamp())
            for key, value in deleted.items():
                totals[key] = totals.get(key, 0) + value
        fires, fire_batches = _prune_fires(transact, cutoff, batch)
        report["batches"] += fire_batches
        report.update({"runs": 0, **totals, ScheduleFire.__tablename__: fires})
    report["seconds"] = round(time.perf_counter() - started, 4)
    return report
