"""Branching steps (``for_each``, ``parallel``): branch runs, admitted as slots free, joined
in the database. No Celery group or chord is involved.

The branching step's execution renders its items and writes one *branch run* per item (or
parallel step) in its claim's transaction: a run of one step, with the parent's owner and args,
pointing back through ``parent_run_id``, ``parent_step`` and ``branch``. A branch run is a run
in every other respect (parks, human answers, effects, retries, cancel, explain, Flower). The
first ``max_concurrency`` are sent; the others wait with ``concurrency = slot``. The parent parks
(``branches``) and no worker waits for it. In a rerun, the branches that completed in the
source with the same input are written ``completed`` instead and not sent
(``branch_runs``); when every branch is, the step joins at once.

A branch run's end (``closing.end_run``, a compare-and-set like every end) hands its parent
to :func:`settle` after commit. Under the parent row's lock, ``settle`` admits waiting
branches into free slots, fails the step on a failure under ``join: all`` (the parent's end
then cancels the other branches), or, once every branch has ended, completes the step with
their outputs and moves the parent on. The step's ``parked -> completed`` transition is the
compare-and-set on the join: of two writers that settle the last branches at once, one moves
the run and the other finds the step no longer parked. The sweeper settles every parent
parked on branches at each pass, so a hand-off lost with its process is sent again.

Locks: a branch run's transactions lock the branch and never its parent; ``settle`` locks the
parent, then the branches it admits; the parent's end locks only the parent and returns its
live branches to end after commit (``Followups.ends``), so no two writers wait on each other.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestration.core.errors import LimitExceeded, OwnerSuspended, ValidationError
from orchestration.core.followups import Done, Followups
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import (
    RUN_TERMINAL,
    ConcurrencyState,
    Join,
    ParkReason,
    RunStatus,
    StepStatus,
    StopReason,
)
from orchestration.execution import branch_runs, finishing, parking
from orchestration.execution.entry import Entry
from orchestration.execution.outcomes import Halt, Outcome
from orchestration.execution.rows import fail
from orchestration.limits import admission, bounds, suspensions
from orchestration.runs import artifacts, chains, closing, effects, files
from orchestration.runs.transitions import lock_run, touch_run, transition_run, transition_step
from orchestration.workflows import decoded, parsing, templates
from orchestration.workflows.steps import StepSpec

_SETTLED = effects.Progress(settled=True, exhausted=[], next_due=None)


def limit(spec: StepSpec, settings: Settings) -> int:
    """Branches of ``spec`` running at once."""
    return min(
        spec.branch_limit or settings.max_branch_concurrency, settings.max_branch_concurrency
    )


def expand(
    session: Session,
    settings: Settings,
    run_id: str,
    entry: Entry,
    context: dict[str, Any],
    now: datetime,
) -> Done[Outcome]:
    """Write the step's branch runs, send the first ``max_concurrency`` and park the parent;
    fail the run clearly if the items are not a list or are over their bounds."""
    spec = entry.spec
    try:
        # A suspended owner's fan-out starts no branch: the run fails naming the suspension.
        suspensions.refuse(session, session.scalar(select(Run.owner).where(Run.id == run_id)) or "")
        branches = _branches(spec, context, settings)
        made = session.scalar(
            select(func.count()).select_from(Run).where(Run.parent_run_id == run_id)
        )
        if (made or 0) + len(branches) > settings.max_branches_per_run:
            raise LimitExceeded(
                f"steps.{spec.id}",
                f"{(made or 0) + len(branches)} branches in the run is over the limit of "
                f"{settings.max_branches_per_run} (ORCH_MAX_BRANCHES_PER_RUN)",
            )
    except LimitExceeded as exc:
        return Done(
            Halt("branches over their bound"),
            fail(session, settings, run_id, f"step {spec.id}: {exc}", now, over=True),
        )
    except (ValidationError, OwnerSuspended) as exc:
        return Done(
            Halt("branches could not be made"),
            fail(session, settings, run_id, f"step {spec.id}: {exc}", now),
        )
    step = session.get(Step, entry.step.pk, populate_existing=True)
    run = session.get(Run, run_id)
    assert step is not None and run is not None
    planned = [
        branch_runs.branch(run, spec, i, key, b, item) for i, (key, b, item) in enumerate(branches)
    ]
    sources = branch_runs.reusable(session, run, step.index)
    reused = {
        one.index: sources[one.index]
        for one in planned
        if branch_runs.same(one, sources.get(one.index), context, settings)
    }
    fresh_count = len(planned) - len(reused)
    try:
        # Refused, not held: branch runs waiting on their owner's budget would hold their
        # parents' places in it, and parents that wait on each other's branches never end.
        admission.check(
            session,
            settings,
            run.owner,
            (admission.ALL_RUNS, admission.OWNER_RUNS),
            fresh_count,
            f"its {fresh_count} branch runs do not fit: ",
        )
    except LimitExceeded as exc:
        return Done(
            Halt("branches over the owner's budget"),
            fail(session, settings, run_id, f"step {spec.id}: {exc.problem}", now, over=True),
        )
    items = [item for _, _, item in branches] if spec.for_each is not None else None
    also = f"; {len(reused)} reused from run {run.rerun_of}" if reused else ""
    transition_step(
        session,
        step,
        StepStatus.RUNNING,
        cause=f"{len(branches)} branches starting{also}",
        now=now,
        values={"input": items if items is not None else [key for key, _, _ in branches]},
    )
    if entry.run_status is RunStatus.QUEUED:
        transition_run(
            session,
            run_id,
            RunStatus.RUNNING,
            cause="first step starting",
            now=now,
        )
    session.refresh(run)  # transitions write SQL directly
    session.refresh(step)
    for one in planned:
        if one.index in reused:
            branch_runs.write_reused(session, run, spec, one, reused[one.index], now)
    fresh = [one for one in planned if one.index not in reused]
    if not fresh:
        # An empty for_each, or every branch reused: nothing to wait for.
        joined = of_step(session, run_id, step.index)
        return Done(
            Halt("no branches to run"), _join(session, settings, run, step, spec, joined, now)
        )
    parking.park(session, settings, run, step, ParkReason.BRANCHES, now)
    slots = limit(spec, settings)
    plans = [
        branch_runs.write(
            session,
            settings,
            run,
            spec,
            one,
            now,
            admit=position < slots,
            launched=(step.evidence or {}).get("branches"),
        )
        for position, one in enumerate(fresh)
    ]
    return Done(
        Halt("waiting for branches"),
        Followups(chains=tuple(plan for plan in plans if plan is not None)),
    )


def _branches(
    spec: StepSpec, context: dict[str, Any], settings: Settings
) -> list[tuple[str, StepSpec, Any]]:
    """``(key, step, item)`` per branch, in branch order."""
    if spec.parallel is not None:
        return [(branch.id, branch, branch_runs.NO_ITEM) for branch in spec.parallel.steps]
    assert spec.step is not None
    field = f"steps.{spec.id}.for_each"
    items = parsing.items_of(
        templates.render(spec.for_each, context, field, limit=settings.max_output_bytes),
        field,
        settings,
    )
    return [(str(index), spec.step, item) for index, item in enumerate(items)]


def settle(
    session: Session, settings: Settings, run_id: str, index: int, now: datetime
) -> Done[bool]:
    """Move branching step ``index`` of ``run_id`` on as its branches stand: admit waiting
    branches into free slots, fail it (``join: all``, or every branch ended under
    ``all_settled``), or complete it. ``False`` when there was nothing to do."""
    if not lock_run(session, run_id, now):
        return Done(False)
    run = session.get(Run, run_id, populate_existing=True)
    assert run is not None
    waiting_here = (
        run.status == RunStatus.PARKED
        and run.park_reason == ParkReason.BRANCHES
        and run.current_step == index
        and run.cancel_requested_at is None
    )
    step = session.scalars(
        select(Step)
        .where(Step.run_id == run_id, Step.index == index)
        .execution_options(populate_existing=True)
    ).first()
    if not waiting_here or step is None or step.status != StepStatus.PARKED:
        return Done(False)
    spec = decoded.of_run(session, run_id)[index]
    branches = of_step(session, run_id, index)
    live = [branch for branch in branches if branch.status not in RUN_TERMINAL]
    failed = [b for b in branches if b.status in RUN_TERMINAL and b.status != RunStatus.COMPLETED]
    if failed and (spec.branch_join is Join.ALL or not live):
        return Done(True, _fail(session, settings, run, step, spec, failed, len(branches), now))
    if not live:
        return Done(True, _join(session, settings, run, step, spec, branches, now))
    running = sum(1 for branch in live if branch.concurrency != ConcurrencyState.SLOT)
    free = limit(spec, settings) - running
    then = Followups()
    for branch in [b for b in live if b.concurrency == ConcurrencyState.SLOT][: max(0, free)]:
        then += admit(session, settings, branch.id, now)
    return Done(bool(then), then)


def of_step(session: Session, run_id: str, index: int) -> list[Any]:
    """The branch runs of step ``index``, in branch order, with their step's columns: what
    ``settle`` joins and what the run's record lists."""
    return list(
        session.execute(
            select(
                Run.id,
                Run.branch,
                Run.branch_key,
                Run.status,
                Run.concurrency,
                Run.error,
                Run.stop_reason,
                Run.started_at,
                Run.finished_at,
                Step.attempt,
                Step.provider_run_id,
                Step.output,
                Step.output_sha256,
            )
            .join(Step, (Step.run_id == Run.id) & (Step.index == 0))
            .where(Run.parent_run_id == run_id, Run.parent_step == index)
            .order_by(Run.branch)
        ).all()
    )


def listed(session: Session, run_id: str) -> dict[int, list[dict[str, Any]]]:
    """The branches of each branching step of ``run_id`` that has made any, as its record
    lists them."""
    listed: dict[int, list[dict[str, Any]]] = {}
    for index, spec in enumerate(decoded.of_run(session, run_id)):
        rows = of_step(session, run_id, index) if spec.branching else []
        if rows:
            listed[index] = [
                {
                    "id": row.branch_key,
                    "index": row.branch,
                    "run_id": row.id,
                    "status": row.status.value,
                    "attempt": row.attempt,
                    "output": None if row.output_sha256 else row.output,
                    "output_artifact": row.output if row.output_sha256 else None,
                    "error": row.error,
                    "provider_run_id": row.provider_run_id,
                    "started_at": row.started_at,
                    "finished_at": row.finished_at,
                }
                for row in rows
            ]
    return listed


def admit(session: Session, settings: Settings, run_id: str, now: datetime) -> Followups:
    """Give a waiting branch run its slot and its first segment."""
    if not touch_run(session, run_id, now, concurrency=None):
        return Followups()
    branch = session.get(Run, run_id, populate_existing=True)
    assert branch is not None
    return chains.arm(session, settings, branch, now=now)


def _join(
    session: Session,
    settings: Settings,
    run: Run,
    step: Step,
    spec: StepSpec,
    branches: list[Any],
    now: datetime,
) -> Followups:
    """Every branch completed: the step's output is theirs, as a list in item order
    (``for_each``) or a map by step id (``parallel``)."""
    values = [artifacts.resolved(session, settings, run.owner, branch) for branch in branches]
    output: Any = values
    if spec.parallel is not None:
        output = {branch.branch_key: value for branch, value in zip(branches, values, strict=True)}
    kept = files.keep(
        session,
        settings,
        owner=run.owner,
        run_pk=run.id,
        step_index=step.index,
        value=output,
        now=now,
    )
    if isinstance(kept, files.Refused):
        return fail(
            session, settings, run.id, f"step {spec.id}: {kept.problem}", now, over=kept.over
        )
    parking.unpark(session, run, step, now)
    return finishing.complete(
        session,
        settings,
        run,
        step,
        kept,
        _SETTLED,
        now,
        steps=len(decoded.of_run(session, run.id)),
        chained=False,
        values={"output": kept.value, "output_sha256": kept.sha256},
    ).then


def _fail(
    session: Session,
    settings: Settings,
    run: Run,
    step: Step,
    spec: StepSpec,
    failed: list[Any],
    count: int,
    now: datetime,
) -> Followups:
    first = failed[0]
    why = first.error or first.stop_reason or first.status
    error = f"branch {first.branch_key} (run {first.id}) ended {first.status}: {why}"
    if len(failed) > 1:
        error += f"; {len(failed)} of {count} branches did not complete"
    return closing.end_run(
        session,
        settings,
        run.id,
        RunStatus.FAILED,
        stop_reason=StopReason.STEP_FAILED,
        cause=f"step {spec.id}: branch {first.branch_key} ended {first.status}",
        now=now,
        error=f"step {spec.id}: {bounds.error_text(error, settings)}",
        step_error=bounds.error_text(error, settings),
    )


def end_orphan(session: Session, settings: Settings, run_id: str, now: datetime) -> Done[bool]:
    """End a live branch run whose parent has ended (the parent's end hands each one here
    after its commit; the sweeper does it for a hand-off that was lost)."""
    if not lock_run(session, run_id, now):
        return Done(False)
    parent_status = session.scalar(
        select(Run.status).where(
            Run.id == select(Run.parent_run_id).where(Run.id == run_id).scalar_subquery()
        )
    )
    if parent_status is None or parent_status not in RUN_TERMINAL:
        return Done(False)
    then = closing.end_run(
        session,
        settings,
        run_id,
        RunStatus.CANCELLED,
        stop_reason=StopReason.PARENT_ENDED,
        cause=f"its parent run ended {parent_status}",
        now=now,
    )
    # The parent has ended: there is nothing to settle.
    return Done(True, Followups(then.chains, then.revoke, then.stops, then.ends))
