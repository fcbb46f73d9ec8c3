"""Starting a provider turn: claimed with the stamp that holds the run, called with no lock.

Invariant 2 rests on the claim: it is written (``steps.start_claimed_at``) in the statement or
the transaction whose stamp compared-and-set the run on "no cancel requested", before the
call, and ``cancel`` waits for a live claim to clear before it reads the turns to stop. The
call itself ends within ``ORCH_PROVIDER_TIMEOUT`` (the transport's hard deadline), so that
wait is bounded, and no lock, not even SQLite's database-wide one, is held across network
I/O. Whether a start may be claimed is :func:`fence.refusal`, applied by the statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core.errors import (
    ArtifactCorrupt,
    ArtifactNotFound,
    LimitExceeded,
    ValidationError,
)
from orchestration.core.followups import Done
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import RunStatus, StepStatus
from orchestration.execution import approving, branching, fence, retrying, turn_budget
from orchestration.execution.entry import Entry, StepRow
from orchestration.execution.fence import Refusal
from orchestration.execution.outcomes import Halt, Outcome, Poll
from orchestration.execution.rows import fail
from orchestration.providers.base import TurnRequest
from orchestration.runs import artifacts, turns
from orchestration.runs.transitions import transition_run
from orchestration.workflows import templates
from orchestration.workflows.steps import StepSpec


@dataclass(frozen=True)
class StartCall:
    """A claimed start: the request to send and the provider to send it to."""

    request: TurnRequest
    provider: str
    #: The claim's time (``steps.start_claimed_at``): the call must end inside the window
    #: that other executions and ``cancel`` give the claim from then.
    claimed_at: datetime


def claim(
    session: Session,
    settings: Settings,
    run_id: str,
    entry: Entry,
    now: datetime,
    *,
    rendered: Any = None,
) -> Done[StartCall | Outcome]:
    """Claim the start of the step ``entry`` fenced, in a transaction whose stamp holds the
    run row: render its task from the run's data (``rendered``: it was rendered before the
    fence), claim it with :data:`fence.CLAIM` unless the fence already did, move a queued run
    to running. A refused claim is acted on (:func:`_refused`); an approval asks its person
    and a branching step makes its branches instead."""
    step = entry.step
    if not step.claimed:
        waiting = _refused(session, settings, run_id, entry, step.refused, now)
        if waiting is not None:
            return waiting
    approval = entry.spec.approval
    if rendered is None or entry.spec.branching:
        made = _render(session, settings, run_id, entry, now)
        if isinstance(made, Done):
            return made
        rendered = made.value
    if approval is None and not step.claimed:
        bound = {
            **fence.params(settings, run_id, step.index, entry.tick - 1, now, None, None),
            "b_pk": step.pk,
            "b_input": rendered,
        }
        written = session.execute(fence.CLAIM, bound).first()
        if written is None:
            return Done(Halt("duplicate or stale delivery"))
        claimed = StepRow.of(dict(written._mapping), run_id, step.index)
        if not claimed.claimed:
            refused = _refused(session, settings, run_id, entry, claimed.refused, now)
            return refused or Done(Poll(entry.spec.poll_interval, entry.tick))
    if entry.run_status is RunStatus.QUEUED:
        transition_run(session, run_id, RunStatus.RUNNING, cause="first step starting", now=now)
    if approval is not None:
        run = session.get(Run, run_id, populate_existing=True)
        row = session.get(Step, step.pk, populate_existing=True)
        assert run is not None and row is not None
        return approving.ask(session, settings, run, row, entry.spec, rendered, now)
    answer, resuming, asked = None, False, None
    if step.attempt > 1:
        # A turn that resumes a human park carries the answer and names the turn that asked;
        # a retry does neither.
        unanswered, answer, asked_turn = session.execute(
            select(Step.answer.is_(None), Step.answer, Step.asked_turn).where(Step.pk == step.pk)
        ).one()
        if not unanswered:
            asked = (asked_turn or {}).get("provider_run_id")
            resuming = True
    return Done(
        start_call(settings, entry, rendered, now, answer=answer, resuming=resuming, asked=asked)
    )


@dataclass(frozen=True)
class _Rendered:
    value: Any


def _render(
    session: Session, settings: Settings, run_id: str, entry: Entry, now: datetime
) -> _Rendered | Done[StartCall | Outcome]:
    """The step's task (an approval's prompt) rendered from the run's data; a branching step
    makes its branches here; a task that cannot be rendered fails the run."""
    step = entry.step
    template, field = _template(entry.spec), "task" if entry.spec.approval is None else "prompt"
    if entry.spec.branching:
        # The items, and the branches' own templates: a rerun compares what they render to.
        template = [entry.spec.for_each, *map(_template, _branch_steps(entry.spec))]
    context: dict[str, Any] = {"args": {}, "steps": {}}
    try:
        if entry.spec.branching or templates.has_placeholders(template):
            context = _context(session, settings, run_id, template)
    except (ArtifactCorrupt, ArtifactNotFound) as exc:
        # An earlier output this template reads cannot be read back: nothing can be rendered.
        return Done(
            Halt("an output it reads is unreadable"),
            fail(session, settings, run_id, f"step {step.step_id}: {exc}", now),
        )
    if entry.spec.branching:
        return branching.expand(session, settings, run_id, entry, context, now)
    try:
        return _Rendered(
            templates.render(template, context, field, limit=settings.max_rendered_task_bytes)
        )
    except LimitExceeded as exc:
        return Done(
            Halt("task renders over its bound"),
            fail(session, settings, run_id, f"step {step.step_id}: {exc}", now, over=True),
        )
    except ValidationError as exc:
        return Done(
            Halt("task could not be rendered"),
            fail(session, settings, run_id, f"step {step.step_id}: {exc}", now),
        )


def _refused(
    session: Session,
    settings: Settings,
    run_id: str,
    entry: Entry,
    refusal: Refusal | None,
    now: datetime,
) -> Done[Outcome] | None:
    """What to do when the step's start may not be claimed (:func:`fence.refusal` said why);
    ``None`` when it may."""
    if refusal is None:
        return None
    if refusal in (Refusal.BACKOFF, Refusal.STOPPING, Refusal.UNSTOPPABLE):
        return retrying.held(session, settings, run_id, entry, refusal, now)
    if refusal is Refusal.TURNS:
        return turn_budget.held(session, settings, run_id, entry, now)
    # Another delivery's start is in flight (it records the turn, or, having lost the fence
    # to this one, hands the turn's id to the step), the turn has started, or the run is not
    # where a turn may start: look again after a poll interval, without calling the provider.
    return Done(Poll(entry.spec.poll_interval, entry.tick))


def start_call(
    settings: Settings,
    entry: Entry,
    rendered: Any,
    claimed_at: datetime,
    *,
    answer: Any = None,
    resuming: bool = False,
    asked: str | None = None,
) -> StartCall:
    """The start to send for the step ``entry`` fenced, its start claimed at ``claimed_at``."""
    step = entry.step
    request = TurnRequest(
        key=step.idempotency_key,
        run_id=step.run_id,
        step_id=step.step_id,
        attempt=step.attempt,
        input=rendered,
        options=entry.spec.options,
        resume=answer,
        resuming=resuming,
        asked=asked,
        deadline=turns.start_deadline(settings, claimed_at),
    )
    return StartCall(request, step.provider, claimed_at)


def plain_task(settings: Settings, spec: StepSpec) -> Any:
    """A turn step's task rendered without reading the run (it names no data), or ``None``
    when rendering needs the run or fails (the full claim renders it, and fails the run)."""
    if spec.approval is not None or spec.branching or templates.has_placeholders(spec.task):
        return None
    try:
        return templates.render(
            spec.task, {"args": {}, "steps": {}}, "task", limit=settings.max_rendered_task_bytes
        )
    except (LimitExceeded, ValidationError):
        return None


def _branch_steps(spec: StepSpec) -> list[StepSpec]:
    """The steps a branching step runs as branches."""
    if spec.parallel is not None:
        return list(spec.parallel.steps)
    return [spec.step] if spec.step is not None else []


def _template(spec: StepSpec) -> Any:
    """What a step renders at its start: its task, or its approval's prompt."""
    return spec.task if spec.approval is None else spec.approval.prompt


def _context(session: Session, settings: Settings, run_id: str, template: Any) -> dict[str, Any]:
    """The run's args and the outputs of its completed steps, for ``template``; a branch run
    sees its parent's completed steps, its ``item`` and its ``index`` too. Only the artifacts
    of the steps the template names are loaded."""
    owner, args, parent, extra = session.execute(
        select(Run.owner, Run.args, Run.parent_run_id, Run.branch_context).where(Run.id == run_id)
    ).one()
    rows = session.execute(
        select(Step.step_id, Step.output, Step.output_sha256).where(
            Step.run_id.in_([run_id] if parent is None else [parent, run_id]),
            Step.status == StepStatus.COMPLETED.value,
        )
    ).all()
    named = templates.named_steps(template)
    outputs = {
        row.step_id: artifacts.resolved(session, settings, owner, row)
        if row.step_id in named
        else row.output
        for row in rows
    }
    context = {
        "args": args,
        "steps": {step_id: {"output": out} for step_id, out in outputs.items()},
    }
    return {**context, **(extra or {})}
