"""The rows of a new run, as a launch (a rerun too) and a fan-out's branches write them: the
run row, its steps and its first chain segment, built in Python and inserted as they are, so
that the record a launch returns needs no read back. Each row carries the ``cause`` of its
first status, which the database journals (:mod:`orchestration.core.status_triggers`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestration.core import deadlines
from orchestration.core.followups import ChainPlan
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import ConcurrencyState, RunStatus, StepStatus
from orchestration.runs import artifacts, chains, concurrency
from orchestration.workflows import steps as step_specs
from orchestration.workflows.steps import StepSpec


@dataclass(frozen=True)
class Reuse:
    """A rerun: the run it reruns, and the outputs of the steps before ``first`` that it
    takes from there instead of starting their turns."""

    rerun_of: str
    first: int
    #: Each reused step's output as its row keeps it (an artifact's reference included).
    outputs: tuple[artifacts.Kept, ...]


def idempotency_key(run_id: str, step_id: str, attempt: int) -> str:
    """The provider turn's key: at most one turn per (run, step, attempt)."""
    return f"{run_id}:{step_id}:{attempt}"


@dataclass(frozen=True)
class NewRun:
    """A validated launch request, as its rows are written."""

    definition: dict[str, Any]
    args: dict[str, Any]
    fingerprint: str
    owner: str
    request_id: str
    concurrency_key: str | None
    on_conflict: concurrency.OnConflict
    now: datetime
    steps: tuple[StepSpec, ...]
    reuse: Reuse | None
    version: int | None
    #: The registry entries its steps name, as kept on the run (``runs.agents``).
    agents: dict[str, Any] | None = None
    #: Per step, what its agent said of itself at launch (``steps.evidence``), or ``None``.
    evidence: tuple[dict[str, Any] | None, ...] = ()


def rows(
    settings: Settings, request: NewRun, decision: concurrency.Decision | None
) -> tuple[Run, list[Step], ChainPlan | None]:
    """The new run's row, its steps and its first chain segment (``None`` for a run queued
    behind a concurrency key's holder: it gets its segment with the claim)."""
    definition, now, reuse = request.definition, request.now, request.reuse
    queued = decision is not None and decision.concurrency is ConcurrencyState.QUEUED
    run_id = uuid.uuid4().hex
    # The first segment's task ids go in with the rows (what ``chains.arm`` would store).
    first = reuse.first if reuse else 0
    plan = None if queued else chains.plan_chain(run_id, first, len(request.steps))
    task_of = {link.index: link.task_id for link in plan.links} if plan else {}
    deadline = (
        concurrency.queued_deadline(settings, decision.holder_deadline, now)
        if decision is not None and queued
        else deadlines.compute(settings, RunStatus.QUEUED, heartbeat_at=now)
    )
    keyed = request.concurrency_key is not None
    run = Run(
        id=run_id,
        owner=request.owner,
        request_id=request.request_id,
        fingerprint=request.fingerprint,
        workflow_name=definition["name"],
        workflow_version=request.version,
        workflow=definition,
        args=request.args,
        status=RunStatus.QUEUED.value,
        cause=_rerun_cause(reuse, definition["steps"]) if reuse else "launched",
        created_at=now,
        updated_at=now,
        heartbeat_at=now,
        deadline_at=deadline,
        task_ids=plan.task_ids if plan else [],
        current_step=first,
        rearms=0,
        rerun_of=reuse.rerun_of if reuse else None,
        concurrency_key=request.concurrency_key,
        on_conflict=request.on_conflict.value if keyed else None,
        concurrency=decision.concurrency.value if decision is not None else None,
        needs_review=False,
    )
    if request.agents is not None:
        run.agents = request.agents
    rows = [
        new_step(
            run_id,
            index,
            step,
            now,
            task_id=task_of.get(index),
            reused=reuse.outputs[index] if reuse is not None and index < first else None,
            reused_from=reuse.rerun_of if reuse is not None else None,
        )
        for index, step in enumerate(definition["steps"])
    ]
    if any(request.evidence):
        # Every row is given the column, so that the steps insert with the same columns.
        for row, seen in zip(rows, request.evidence, strict=True):
            row.evidence = seen
    return run, rows, plan


#: The columns in which the new steps of one run differ (what :func:`new_step` derives from
#: the step's position and spec, and the first segment's task ids); every other column it
#: sets is the same for all of a launch's pending steps (a rerun's reused steps aside).
PER_STEP = ("index", "step_id", "provider", "idempotency_key", "celery_task_id")


def new_step(
    run_id: str,
    index: int,
    step: dict[str, Any],
    now: datetime,
    *,
    task_id: str | None,
    reused: artifacts.Kept | None = None,
    reused_from: str | None = None,
) -> Step:
    """A new run's step row from its stored spec: pending, or ``completed`` with the output
    a rerun reuses (``reused``, from run ``reused_from``)."""
    return Step(
        run_id=run_id,
        index=index,
        step_id=step["id"],
        provider=step_specs.provider_column(step),
        status=(StepStatus.COMPLETED if reused is not None else StepStatus.PENDING).value,
        cause=f"output reused from run {reused_from}" if reused is not None else "launched",
        attempt=1,
        idempotency_key=idempotency_key(run_id, step["id"], 1),
        polls=0,
        output=reused.value if reused is not None else None,
        output_sha256=reused.sha256 if reused is not None else None,
        finished_at=now if reused is not None else None,
        celery_task_id=task_id,
        created_at=now,
        updated_at=now,
    )


def _rerun_cause(reuse: Reuse, steps: list[dict[str, Any]]) -> str:
    """A rerun's first cause names the run it reruns and the step it starts at."""
    if reuse.first < len(steps):
        return f"rerun of {reuse.rerun_of} from step {steps[reuse.first]['id']!r}"
    return f"rerun of {reuse.rerun_of}"
