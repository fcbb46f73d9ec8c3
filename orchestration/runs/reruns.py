"""Reruns: a new run of an ended run's workflow that reuses the outputs of the steps before the
one it starts from, without starting their turns.

The new run is an ordinary launch (``launching.launch_then`` with a :class:`Reuse`): the
reused steps are written ``completed`` with their outputs (the journal says where each came
from), the chain starts at the first step to run, and ``rerun_of`` links it to the source,
whose record lists its ``reruns``. A rerun is idempotent per (owner, request id) like every
launch. A branching step that the source did not complete runs only the branches that did
not complete there (``execution.branch_runs``); the join sees every branch's output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core import ownership
from orchestration.core.errors import ConflictError, ValidationError
from orchestration.core.models import Run, Step
from orchestration.core.states import RunStatus, StepStatus
from orchestration.runs import artifacts
from orchestration.runs.new_rows import Reuse

#: The statuses a run may be rerun from: every end but a completed one.
RERUNNABLE = frozenset(
    {RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.INTERRUPTED, RunStatus.CANCELLED}
)


@dataclass(frozen=True)
class Source:
    """What a rerun takes from the run it reruns."""

    run_id: str
    status: RunStatus
    workflow: dict[str, Any]
    args: dict[str, Any]
    concurrency_key: str | None
    on_conflict: str | None
    #: ``(step_id, status, output)`` per step, in order (the output as its row keeps it).
    steps: tuple[tuple[str, StepStatus, artifacts.Kept], ...]
    #: The registered version it ran (``None``: launched from a file).
    workflow_version: int | None = None


def source(session: Session, run_id: str, owner: str) -> Source:
    """The owner's run ``run_id`` as a rerun reads it (another owner's is not found)."""
    run = ownership.mine(session.get(Run, ownership.checked(run_id)), run_id, owner)
    rows = session.execute(
        select(Step.step_id, Step.status, Step.output, Step.output_sha256)
        .where(Step.run_id == run_id)
        .order_by(Step.index)
    ).all()
    return Source(
        run.id,
        RunStatus(run.status),
        run.workflow,
        run.args,
        run.concurrency_key,
        run.on_conflict,
        tuple(
            (step_id, StepStatus(status), artifacts.Kept(output, sha256))
            for step_id, status, output, sha256 in rows
        ),
        run.workflow_version,
    )


def plan(run: Source, from_step: str | None) -> Reuse:
    """Which steps the rerun reuses: those before ``from_step``, or before the first step
    that did not complete."""
    if run.status not in RERUNNABLE:
        raise ConflictError(
            f"run {run.run_id} is {run.status.value}: only a run that ended failed, timed_out, "
            "interrupted or cancelled can be rerun"
        )
    ids = [step_id for step_id, _, _ in run.steps]
    if from_step is None:
        first = next(
            (i for i, (_, status, _) in enumerate(run.steps) if status != StepStatus.COMPLETED),
            len(ids) - 1,
        )
    elif from_step in ids:
        first = ids.index(from_step)
    else:
        raise ValidationError("from_step", f"run {run.run_id} has no step {from_step!r}")
    unfinished = [ids[i] for i in range(first) if run.steps[i][1] != StepStatus.COMPLETED]
    if unfinished:
        raise ValidationError(
            "from_step",
            f"step {unfinished[0]!r} before {ids[first]!r} did not complete; "
            f"rerun from {unfinished[0]!r}",
        )
    return Reuse(run.run_id, first, tuple(output for _, _, output in run.steps[:first]))
