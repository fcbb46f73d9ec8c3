"""The rows of a new run, as a launch (a rerun too) and a fan-out's branches write them: the
run row, its steps, its first journal rows and its first chain segment, built in Python and
inserted as they are, so that the record a launch returns needs no read back."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestration import artifacts, chains, claims, deadlines, step_specs
from orchestration.followups import ChainPlan
from orchestration.models import Run, RunEvent, Step
from orchestration.settings import Settings
from orchestration.states import ClaimState, RunStatus, StepStatus
from orchestration.step_specs import StepSpec


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
    on_conflict: claims.OnConflict
    now: datetime
    steps: tuple[StepSpec, ...]
    reuse: Reuse | None
    version: int | None


def rows(
    settings: Settings, request: NewRun, decision: claims.Decision | None
) -> tuple[Run, list[Step], list[RunEvent], ChainPlan | None]:
    """The new run's row, its steps, its journal and its first chain segment (``None`` for a
    run queued behind a concurrency key's holder: it gets its segment with the claim)."""
    definition, now, reuse = request.definition, request.now, request.reuse
    queued = decision is not None and decision.claim is ClaimState.QUEUED
    run_id = uuid.uuid4().hex
    # The first segment's task ids go in with the rows (what ``chains.arm`` would store).
    first = reuse.first if reuse else 0
    plan = None if queued else chains.plan_chain(run_id, first, len(request.steps))
    task_of = {link.index: link.task_id for link in plan.links} if plan else {}
    deadline = (
        claims.queued_deadline(settings, decision.holder_deadline, now)
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
        claim=decision.claim.value if decision is not None else None,
        needs_review=False,
    )
    rows = [
        new_step(
            run_id,
            index,
            step,
            now,
            task_id=task_of.get(index),
            reused=reuse.outputs[index] if reuse is not None and index < first else None,
        )
        for index, step in enumerate(definition["steps"])
    ]
    events = [
        queued_event(
            run_id,
            f"rerun of {reuse.rerun_of} from step {definition['steps'][first]['id']!r}"
            if reuse
            else "launched",
            now,
        ),
        *(
            RunEvent(
                run_id=run_id,
                step_id=definition["steps"][index]["id"],
                from_status=None,
                to_status=StepStatus.COMPLETED.value,
                cause=f"output reused from run {reuse.rerun_of if reuse else '?'}",
                at=now,
            )
            for index in range(first)
        ),
    ]
    return run, rows, events, plan


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
) -> Step:
    """A new run's step row from its stored spec: pending, or ``completed`` with the output
    a rerun reuses (``reused``)."""
    return Step(
        run_id=run_id,
        index=index,
        step_id=step["id"],
        provider=step_specs.provider_column(step),
        status=(StepStatus.COMPLETED if reused is not None else StepStatus.PENDING).value,
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


def queued_event(run_id: str, cause: str, now: datetime) -> RunEvent:
    """The journal's first row of a new run."""
    return RunEvent(
        run_id=run_id, from_status=None, to_status=RunStatus.QUEUED.value, cause=cause, at=now
    )
