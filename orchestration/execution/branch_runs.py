"""The rows of a branch run: a fresh one that will run, or one a rerun reuses.

A rerun (``runs.rerun_of``) that reaches a branching step its source did not complete takes
each branch of the source that completed, at the same position and key, with the same
definition, args and item (its fingerprint and ``branch_context``) and the same rendered
input, as it is: the branch run is written ``completed`` with the source branch's output and
no turn is started; the journal names the branch run it came from. The others are written
fresh and run. A branching step that completed in the source (rerun from it by name) runs
all its branches again: naming it asks for it to run.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core import deadlines
from orchestration.core.errors import ValidationError
from orchestration.core.followups import ChainPlan
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import ConcurrencyState, RunStatus, StepStatus, StopReason
from orchestration.runs import artifacts, chains, files
from orchestration.runs.new_rows import new_step
from orchestration.workflows import agents, decoded, parsing, templates
from orchestration.workflows import steps as step_specs
from orchestration.workflows.steps import StepSpec

#: A ``parallel`` branch has no item.
NO_ITEM = object()


@dataclass(frozen=True)
class Branch:
    """One branch of a branching step as its run is written: position, key, step, the run's
    stored definition, its fingerprint and what its templates see beside the parent's."""

    index: int
    key: str
    spec: StepSpec
    definition: dict[str, Any]
    fingerprint: str
    context: dict[str, Any] | None


@dataclass(frozen=True)
class Completed:
    """A branch of the source run that completed: what a rerun compares and reuses."""

    run_id: str
    key: str
    fingerprint: str
    context: Any
    input: Any
    output: Any
    #: Set when ``output`` is a stored artifact's reference, not the value itself.
    output_sha256: str | None


def branch(parent: Run, spec: StepSpec, index: int, key: str, step: StepSpec, item: Any) -> Branch:
    """The branch at ``index`` of ``parent``'s branching step ``spec``."""
    definition = {
        "name": f"{parent.workflow_name}/{spec.id}"[:200],
        "steps": [step_specs.canonical_step(step)],
    }
    return Branch(
        index,
        key,
        step,
        definition,
        parsing.fingerprint(definition, parent.args, {"branch": index}),
        None if item is NO_ITEM else {"item": item, "index": index},
    )


def reusable(session: Session, parent: Run, index: int) -> dict[int, Completed]:
    """The completed branches, by position, of step ``index`` of the run ``parent`` reruns,
    when that step did not complete there; empty for a run that is not a rerun."""
    if parent.rerun_of is None:
        return {}
    step_status = session.scalar(
        select(Step.status).where(Step.run_id == parent.rerun_of, Step.index == index)
    )
    if step_status is None or step_status == StepStatus.COMPLETED:
        return {}
    rows = session.execute(
        select(Run.id, Run.branch, Run.branch_key, Run.fingerprint, Run.branch_context)
        .add_columns(Step.input, Step.output, Step.output_sha256)
        .join(Step, (Step.run_id == Run.id) & (Step.index == 0))
        .where(
            Run.parent_run_id == parent.rerun_of,
            Run.parent_step == index,
            Run.status == RunStatus.COMPLETED.value,
            Step.status == StepStatus.COMPLETED.value,
        )
    ).all()
    return {
        row.branch: Completed(
            row.id,
            row.branch_key,
            row.fingerprint,
            row.branch_context,
            row.input,
            row.output,
            row.output_sha256,
        )
        for row in rows
    }


def same(
    made: Branch, source: Completed | None, context: dict[str, Any], settings: Settings
) -> bool:
    """Whether ``source`` ran what ``made`` would: same key, definition, args and item, and
    the same rendered input (the parent's earlier outputs may differ in a rerun from an
    earlier step). A template that does not render here is not reused: the branch runs and
    fails as it would have."""
    if source is None or (source.key, source.fingerprint) != (made.key, made.fingerprint):
        return False
    if source.context != made.context:
        return False
    template = made.spec.task if made.spec.approval is None else made.spec.approval.prompt
    field = "task" if made.spec.approval is None else "prompt"
    try:
        rendered = templates.render(
            template,
            {**context, **(made.context or {})},
            field,
            limit=settings.max_rendered_task_bytes,
        )
    except ValidationError:
        return False
    return bool(rendered == source.input)


def _row(parent: Run, made: Branch, now: datetime, **values: Any) -> Run:
    """The columns every branch run shares; ``values`` are its status's."""
    return Run(
        id=uuid.uuid4().hex,
        owner=parent.owner,
        request_id=f"{parent.id}.{parent.current_step}.{made.index}",
        fingerprint=made.fingerprint,
        workflow_name=made.definition["name"],
        workflow=made.definition,
        args=parent.args,
        created_at=now,
        updated_at=now,
        heartbeat_at=now,
        current_step=0,
        rearms=0,
        needs_review=False,
        parent_run_id=parent.id,
        parent_step=parent.current_step,
        branch=made.index,
        branch_key=made.key,
        branch_context=made.context,
        agents=parent.agents,
        **values,
    )


def write(
    session: Session,
    settings: Settings,
    parent: Run,
    spec: StepSpec,
    made: Branch,
    now: datetime,
    *,
    admit: bool,
    launched: Mapping[str, Any] | None = None,
) -> ChainPlan | None:
    """Insert one branch run and its step; return its first segment if it is admitted now.
    ``launched``: what the launch recorded of the branches' agents, by step id (the
    branching step's ``evidence["branches"]``), the branch's ``launch`` evidence."""
    waiting = "" if admit else "; waiting for a slot"
    run = _row(
        parent,
        made,
        now,
        status=RunStatus.QUEUED.value,
        cause=f"branch {made.key} of step {spec.id} of run {parent.id}{waiting}",
        # Admitted: its heartbeat's deadline; waiting for a slot: its parent's, which ends
        # it if nothing else does.
        deadline_at=deadlines.compute(settings, RunStatus.QUEUED, heartbeat_at=now)
        if admit
        else parent.deadline_at,
        concurrency=None if admit else ConcurrencyState.SLOT.value,
    )
    plan = chains.plan_chain(run.id, 0, 1) if admit else None
    run.task_ids = plan.task_ids if plan else []
    session.add(run)
    only = made.definition["steps"][0]
    row = new_step(run.id, 0, only, now, task_id=plan.links[0].task_id if plan else None)
    if launched and made.spec.id in launched:
        row.evidence = {"launch": launched[made.spec.id]}
    session.add(row)
    decoded.remember(run.id, agents.applied((made.spec,), parent.agents))
    return plan


def write_reused(
    session: Session, parent: Run, spec: StepSpec, made: Branch, source: Completed, now: datetime
) -> None:
    """Insert a branch run that is ``completed`` with ``source``'s input and output and
    started no turn; its first status's cause names where it came from."""
    why = (
        f"branch {made.key} of step {spec.id} of run {parent.id}: output reused from "
        f"branch run {source.run_id} of run {parent.rerun_of}"
    )
    run = _row(
        parent,
        made,
        now,
        status=RunStatus.COMPLETED.value,
        cause=why,
        stop_reason=StopReason.COMPLETED.value,
        result=source.output,
        result_sha256=source.output_sha256,
        finished_at=now,
        deadline_at=None,
        task_ids=[],
        concurrency=None,
    )
    session.add(run)
    reused = artifacts.Kept(source.output, source.output_sha256)
    artifacts.touch(session, parent.owner, files.hashes(reused), now)
    step = new_step(
        run.id,
        0,
        made.definition["steps"][0],
        now,
        task_id=None,
        reused=reused,
        reused_from=source.run_id,
    )
    step.input = source.input
    session.add(step)
