"""Deleting runs: the rows of a run and of its branch runs, and the artifacts nothing else
references. An owner's delete of one ended run (``orchestration delete``, ``DELETE
/runs/{id}``) and the operator's time-based prune (:mod:`orchestration.upkeep.retention`)
both delete through :func:`delete_rows` and :func:`delete_unreferenced`.

An owner's delete is one transaction that starts with a guarded write: the run's row is
locked only if it is the owner's and terminal (an ``UPDATE … WHERE status IN (terminal)``,
which SQLite's write lock honours too), so a concurrent delete waits and then finds nothing,
and an answer, a cancel or a step, which write only a live run, never meet a half-deleted one.
Under that lock :func:`cleaning_up` says whether the engine still needs the run's rows:

- a branch run still live (the branch's own transaction ends it and then settles the parent);
- a live rerun of it (its branching steps reuse this run's completed branches);
- a provider start claimed within one call's bound (the execution that claimed it stops an
  orphan turn through the step's row, :mod:`orchestration.execution.releasing`);
- a turn stop not yet confirmed (``steps.turn_stop`` pending: the ``stop_turn`` task records
  its outcome there), until the stop task's whole budget has passed since its last attempt;
- an effect attempt in flight (a pending outbox row touched within one call's bound; an
  effect left pending by a run that ended is never attempted again).

Each of these ends within a stated bound, so a refused delete succeeds when tried again.
A schedule fire keeps its ``run_id`` (no foreign key: the listing shows the run as gone), and
so does a rerun's ``rerun_of``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, Text, and_, cast, delete, exists, or_, select, tuple_, update
from sqlalchemy.orm import Session, aliased

from orchestration.core.db import constant_in
from orchestration.core.errors import ConflictError, RunNotFound
from orchestration.core.models import (
    Artifact,
    Checkpoint,
    Effect,
    Run,
    RunDeletion,
    RunEvent,
    Step,
)
from orchestration.core.settings import MARGIN_SECONDS, Settings
from orchestration.core.states import RUN_LIVE, RUN_TERMINAL, EffectStatus, TurnStopStatus
from orchestration.runs import artifacts, files, turns

#: Every table that holds a run's rows, deleted in this order before the runs themselves.
CHILDREN = (RunEvent, Effect, Checkpoint, Step)
#: The longest wait between two attempts of the ``stop_turn`` task (``turns.attempt``).
_STOP_BACKOFF_CAP = 30.0


@dataclass
class Deleted:
    """What :func:`delete_rows` deleted: rows per table (``runs``, ``branch_runs`` and each
    child table), the deleted runs' ``(status, stop_reason, finished_at,
    cancel_requested_at)`` for ``/metrics`` totals, and the artifacts their steps referenced."""

    counts: dict[str, int] = field(default_factory=dict)
    gone: list[Any] = field(default_factory=list)
    candidates: list[tuple[str, str]] = field(default_factory=list)
    #: The candidates that are files an output names (:mod:`orchestration.runs.files`).
    files: list[tuple[str, str]] = field(default_factory=list)


def referenced(session: Session, run_ids: list[str]) -> list[tuple[str, str]]:
    """The ``(owner, sha256)`` the steps of ``run_ids`` reference as their outputs."""
    rows = session.execute(
        select(Run.owner, Step.output_sha256)
        .join(Run, Run.id == Step.run_id)
        .where(Step.run_id.in_(run_ids), Step.output_sha256.is_not(None))
        .distinct()
    ).all()
    return [(owner, str(sha256)) for owner, sha256 in rows]


def named_files(session: Session, run_ids: Any) -> list[tuple[str, str]]:
    """The ``(owner, sha256)`` of the files the outputs of ``run_ids``' steps (a list or a
    select of ids) name; only outputs whose JSON mentions a file are read."""
    rows = session.execute(
        select(Run.owner, Step.output, Step.output_sha256)
        .join(Run, Run.id == Step.run_id)
        .where(Step.run_id.in_(run_ids), cast(Step.output, Text).contains('"file'))
    ).all()
    found = {
        (owner, sha256) for owner, output, kept in rows for sha256 in files.named(output, kept)
    }
    return sorted(found)


def kept_as_output() -> ColumnElement[bool]:
    """Whether a step of the artifact's owner keeps the artifact as its output."""
    return exists().where(
        Step.output_sha256 == Artifact.sha256,
        Step.run_id == Run.id,
        Run.owner == Artifact.owner,
    )


def names_file(*where: Any) -> ColumnElement[bool]:
    """Whether a step of the artifact's owner (and ``where``) has an output that names the
    artifact's hash: a search of the outputs' text (no column lists the files an output
    names), so it is asked only of artifacts a deleted output named as a file."""
    return exists().where(
        Step.run_id == Run.id,
        Run.owner == Artifact.owner,
        cast(Step.output, Text).contains(Artifact.sha256),
        *where,
    )


def delete_rows(session: Session, run_ids: list[str]) -> Deleted:
    """Delete the top-level runs ``run_ids`` and their branch runs with every row they own,
    child tables first (no foreign-key cascade needed, on either database). The caller has
    chosen runs that are terminal with no live branch; their artifacts are left to
    :func:`delete_unreferenced`."""
    branch_ids = list(session.scalars(select(Run.id).where(Run.parent_run_id.in_(run_ids))))
    every = run_ids + branch_ids
    deleted = Deleted({"runs": len(run_ids), "branch_runs": len(branch_ids)})
    deleted.files = named_files(session, every)
    deleted.candidates = sorted(set(referenced(session, every)) | set(deleted.files))
    for model in CHILDREN:
        done = session.execute(
            delete(model)
            .where(model.run_id.in_(every))
            .execution_options(synchronize_session=False)
        )
        deleted.counts[model.__tablename__] = int(done.rowcount or 0)  # type: ignore[attr-defined]
    for chunk in (branch_ids, run_ids):  # a branch run's row points at its parent's
        if chunk:
            deleted.gone += session.execute(
                delete(Run)
                .where(Run.id.in_(chunk))
                .returning(Run.status, Run.stop_reason, Run.finished_at, Run.cancel_requested_at)
                .execution_options(synchronize_session=False)
            ).all()
    return deleted


def delete_unreferenced(
    session: Session,
    candidates: list[tuple[str, str]],
    *,
    files_named: list[tuple[str, str]] | None = None,
    stored_before: datetime | None = None,
) -> tuple[int, list[str]]:
    """Delete the candidate artifacts that no step of their owner references any more (and,
    with ``stored_before``, that no store stamped since): the count, and the hashes no
    owner's row names now (whose files may go, :func:`unlink`). A candidate in
    ``files_named`` (a file an output named) is referenced, too, while any output of the
    owner's steps names its hash: a search of their text, so only those candidates pay it.

    The candidates' rows are locked first: a rerun or a launch that references one again
    stamps its row, so it either waits for this delete (and then finds it gone: a clear
    error, or a fresh store) or commits first, and the check that follows, a statement of
    its own, sees its steps."""
    deleted = 0
    if candidates:
        chosen = tuple_(Artifact.owner, Artifact.sha256).in_(candidates)
        session.execute(select(Artifact.sha256).where(chosen).with_for_update()).all()
        still = kept_as_output()
        if files_named:
            still = or_(
                still,
                and_(tuple_(Artifact.owner, Artifact.sha256).in_(files_named), names_file()),
            )
        statement = delete(Artifact).where(chosen, ~still)
        if stored_before is not None:
            statement = statement.where(Artifact.used_at < stored_before)
        done = session.execute(statement.execution_options(synchronize_session=False))
        deleted = int(done.rowcount or 0)  # type: ignore[attr-defined]
    hashes = sorted({sha256 for _, sha256 in candidates})
    named = set(session.scalars(select(Artifact.sha256).where(Artifact.sha256.in_(hashes))))
    return deleted, [sha256 for sha256 in hashes if sha256 not in named]


def unlink(folder: str | None, hashes: list[str], before: float) -> None:
    """After the commit, remove the files of ``hashes`` (which no row names) that were not
    written since ``before`` (a POSIX time: a store touches its file before its row)."""
    if folder is None:
        return
    for sha256 in hashes:
        path = artifacts.file_path(Path(folder), sha256)
        try:
            if path.stat().st_mtime < before:
                os.unlink(path)
        except FileNotFoundError:
            continue


@dataclass(frozen=True)
class Deletion:
    """An owner's deleted run, as its audit row records it, and what went with it."""

    run_id: str
    owner: str
    workflow: str
    status: str
    deleted_at: datetime
    by: str
    deleted: Deleted
    artifacts: int
    #: Hashes no row names any more: their files in ``ORCH_ARTIFACT_DIR`` go after commit.
    unnamed: list[str]


def delete_owned(
    session: Session, settings: Settings, run_id: str, *, owner: str, by: str, now: datetime
) -> Deletion:
    """Delete ``owner``'s ended run ``run_id``, its branch runs and the artifacts nothing else
    references, and record the deletion, in the caller's transaction.

    Raises :class:`RunNotFound` for a missing run or another owner's (invariant 7), and
    :class:`ConflictError` saying why and what to do for a live run, a branch run, or a run
    still cleaning up (:func:`cleaning_up`)."""
    if not isinstance(run_id, str) or len(run_id) > 64:
        raise RunNotFound(str(run_id)[:64])
    locked = session.execute(
        update(Run)
        .where(Run.id == run_id, Run.owner == owner, constant_in(Run.status, RUN_TERMINAL))
        .values(updated_at=now)
        .returning(Run.status, Run.parent_run_id, Run.workflow_name, Run.workflow_version)
        .execution_options(synchronize_session=False)
    ).first()
    if locked is None:
        found = session.execute(
            select(Run.status, Run.parent_run_id).where(Run.id == run_id, Run.owner == owner)
        ).first()
        if found is None:
            raise RunNotFound(run_id)
        status, parent = found
        _refuse_branch(run_id, parent)
        raise ConflictError(
            f"run {run_id} is {status}: only an ended run can be deleted; cancel it first "
            f"(orchestration cancel {run_id}), then delete it"
        )
    status, parent, name, version = locked
    _refuse_branch(run_id, parent)
    why = cleaning_up(session, settings, run_id, now)
    if why is not None:
        raise ConflictError(f"run {run_id} is {status} but still cleaning up: {why}")
    deleted = delete_rows(session, [run_id])
    count, unnamed = delete_unreferenced(session, deleted.candidates, files_named=deleted.files)
    workflow = name if version is None else f"{name}@{version}"
    session.add(
        RunDeletion(
            run_id=run_id,
            owner=owner,
            workflow=workflow,
            status=str(status),
            deleted_at=now,
            by=by,
            branch_runs=deleted.counts["branch_runs"],
        )
    )
    return Deletion(run_id, owner, workflow, str(status), now, by, deleted, count, unnamed)


def _refuse_branch(run_id: str, parent: str | None) -> None:
    """A branch run goes only with its parent (whose record and join read it)."""
    if parent is not None:
        raise ConflictError(
            f"run {run_id} is a branch of run {parent}: delete run {parent}, which deletes "
            "its branch runs with it"
        )


def cleaning_up(session: Session, settings: Settings, run_id: str, now: datetime) -> str | None:
    """Why the engine still needs the rows of the ended run ``run_id`` (see the module's
    docstring), with what to do; ``None`` when it may go."""
    other = aliased(Run)
    family = select(Run.id).where((Run.id == run_id) | (Run.parent_run_id == run_id))
    live = constant_in(other.status, RUN_LIVE)
    branch = session.execute(
        select(other.id, other.status).where(other.parent_run_id == run_id, live).limit(1)
    ).first()
    if branch is not None:
        return (
            f"its branch run {branch.id} is {branch.status}; it ends by itself (the sweeper "
            "ends the branches of an ended run), delete the run once it has"
        )
    rerun = session.execute(
        select(other.id, other.status).where(other.rerun_of == run_id, live).limit(1)
    ).first()
    if rerun is not None:
        return (
            f"run {rerun.id}, a rerun of it, is {rerun.status} and may reuse its outputs; "
            "delete it once that rerun has ended"
        )
    call = turns.claim_window(settings)
    claim = session.scalar(
        select(Step.step_id).where(Step.run_id.in_(family), Step.start_claimed_at > now - call)
    )
    if claim is not None:
        return (
            f"a provider start of step {claim} is still in flight; it is recorded or stopped "
            f"within {call.total_seconds():g}s (ORCH_PROVIDER_TIMEOUT and a margin): try again then"
        )
    stop = _unconfirmed_stop(session, settings, family, now)
    if stop is not None:
        return stop
    effect_call = max(settings.provider_timeout, settings.webhook_timeout) + MARGIN_SECONDS
    effect = session.scalar(
        select(Effect.kind).where(
            Effect.run_id.in_(family),
            Effect.status == EffectStatus.PENDING.value,
            Effect.updated_at > now - timedelta(seconds=effect_call),
        )
    )
    if effect is not None:
        return (
            f"its {effect} effect may still be running; it ends within {effect_call:g}s "
            "(one call's bound and a margin): try again then"
        )
    return None


def stop_budget(settings: Settings) -> timedelta:
    """How long after its last recorded attempt a pending turn stop may still be tried: the
    ``stop_turn`` task's longest backoff and one call, for each attempt it has left."""
    each = _STOP_BACKOFF_CAP + settings.provider_timeout + MARGIN_SECONDS
    return timedelta(seconds=each * settings.stop_attempts)


def _unconfirmed_stop(
    session: Session, settings: Settings, family: Any, now: datetime
) -> str | None:
    """The first step of the run (or its branches) whose turn stop is pending and still within
    :func:`stop_budget` of its last attempt, in words; ``None`` when there is none."""
    pending = session.execute(
        select(Step.step_id, Step.turn_stop["at"].as_string()).where(
            Step.run_id.in_(family),
            Step.turn_stop["status"].as_string() == TurnStopStatus.PENDING.value,
        )
    ).all()
    budget = stop_budget(settings)
    for step_id, at in pending:
        if at is None or datetime.fromisoformat(at) > now - budget:
            return (
                f"the stop of step {step_id}'s provider turn is not confirmed yet (the stop "
                f"task tries it up to ORCH_STOP_ATTEMPTS={settings.stop_attempts} times); "
                f"try again once `orchestration show` gives its turn_stop as stopped or failed"
            )
    return None


def listing(session: Session, *, owner: str | None, limit: int) -> list[dict[str, Any]]:
    """The latest ``limit`` recorded deletions, newest first (``owner``'s only, if given)."""
    query = select(RunDeletion).order_by(RunDeletion.deleted_at.desc(), RunDeletion.pk.desc())
    if owner is not None:
        query = query.where(RunDeletion.owner == owner)
    return [
        {
            "run_id": row.run_id,
            "owner": row.owner,
            "workflow": row.workflow,
            "status": row.status,
            "deleted_at": row.deleted_at,
            "by": row.by,
            "branch_runs": row.branch_runs,
        }
        for row in session.scalars(query.limit(limit))
    ]
