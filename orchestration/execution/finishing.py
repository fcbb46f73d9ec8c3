"""A finished turn: its output recorded, its effects settled, the step completed and the run
moved on, in one transaction when the effects ran inline (the checkpoint alone, the default).

With a webhook configured, effects go through the outbox: the output is recorded and the run
waits (``waiting``) while the effects phase runs them with bounded attempts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from orchestration.core import deadlines
from orchestration.core.followups import Done, Followups
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import RunStatus, StepStatus, StopReason
from orchestration.execution.outcomes import Halt, Outcome, Poll, Proceed
from orchestration.execution.parking import unpark
from orchestration.execution.rows import fail
from orchestration.runs import artifacts, chains, closing, effects, files
from orchestration.runs.transitions import touch_run, touch_step, transition_run, transition_step


@dataclass(frozen=True)
class EffectsDue:
    """The output is recorded and the run waits: run the step's effects now."""


def finish(
    session: Session,
    settings: Settings,
    run: Run,
    step: Step,
    output: Any,
    now: datetime,
    *,
    captured: tuple[Any, str | None] | None,
    steps: int,
    chained: bool,
    recorded: Mapping[str, Any],
) -> Done[Outcome | EffectsDue]:
    """Record the turn's output (with ``recorded``, the other step columns the caller has to
    write; an output over ``ORCH_INLINE_OUTPUT_BYTES`` as an artifact's reference, its files
    as artifacts' references, :mod:`orchestration.runs.files`); with
    ``captured`` (the inline checkpoint attempt), settle the effects and complete the step in
    this transaction, all of the step's columns in one statement."""
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
        error = f"step {step.step_id}: {kept.problem}"
        return Done(
            Halt("output too large" if kept.over else "a file in the output is broken"),
            fail(session, settings, run.id, error, now, over=kept.over),
        )
    unpark(session, run, step, now)
    values = {**recorded, "output": kept.value, "output_sha256": kept.sha256, "error": None}
    if captured is not None:
        progress = effects.record_capture(session, settings, step, captured, now)
        if progress.settled:
            return complete(
                session,
                settings,
                run,
                step,
                kept,
                progress,
                now,
                steps=steps,
                chained=chained,
                values=values,
            )
    touch_step(session, step, now, **values)
    if captured is None:
        effects.enqueue(session, settings, step, now=now)
    transition_run(
        session,
        run.id,
        RunStatus.WAITING,
        cause=f"step {step.step_id} turn finished; running effects",
        now=now,
    )
    if captured is None:
        return Done(EffectsDue())
    wait = 0.0
    if progress.next_due is not None:
        wait = max(0.0, (progress.next_due - now).total_seconds())
    return Done(Poll(wait, step.polls))


def complete(
    session: Session,
    settings: Settings,
    run: Run,
    step: Step,
    result: artifacts.Kept,
    progress: effects.Progress,
    now: datetime,
    *,
    steps: int,
    chained: bool,
    values: Mapping[str, Any] | None = None,
) -> Done[Outcome | EffectsDue]:
    """Effects settled: complete the step (writing ``values`` too) and move the run to the
    next step, or end it (with the step's output, as its row keeps it, for ``result``).

    ``chained`` says whether this execution's message carries the next link; if not (the
    last link of a segment, or a step that polled), the next segment is armed here."""
    if progress.exhausted and settings.effect_policy == "fail":
        return Done(
            Halt("effect exhausted its attempts"),
            closing.end_run(
                session,
                settings,
                run.id,
                RunStatus.FAILED,
                stop_reason=StopReason.EFFECT_FAILED,
                cause=f"step {step.step_id}: an effect exhausted its attempts",
                now=now,
                error=f"step {step.step_id}: " + "; ".join(progress.exhausted),
                step_error="; ".join(progress.exhausted),
                revoke=False,
                stop_turns=False,
            ),
        )
    failed = "; ".join(progress.exhausted)
    last = step.index == steps - 1
    waiting = run.status == RunStatus.WAITING
    # The next step has not started: until its first execution stamps the run, the deadline
    # is the heartbeat's (the finished step's timeout no longer bounds anything).
    moved = {
        "current_step": step.index + 1,
        "heartbeat_at": now,
        "deadline_at": deadlines.compute(settings, RunStatus.RUNNING, heartbeat_at=now),
    }
    # A running run whose message carries the next link is moved on in the step's statement.
    along = not last and chained and not waiting
    transition_step(
        session,
        step,
        StepStatus.COMPLETED,
        cause="turn finished and effects ran" + (f"; {failed}" if failed else ""),
        now=now,
        values={**(values or {}), "error": failed or None},
        run_values=moved if along else None,
    )
    if along:
        return Done(Proceed())
    if last:
        then = closing.end_run(
            session,
            settings,
            run.id,
            RunStatus.COMPLETED,
            stop_reason=StopReason.COMPLETED,
            cause="last step completed",
            now=now,
            result=result.value,
            result_sha256=result.sha256,
            revoke=False,
        )
        return Done(Proceed(), then)
    if waiting:
        transition_run(
            session,
            run.id,
            RunStatus.RUNNING,
            cause=f"step {step.step_id} completed",
            now=now,
            values=moved,
        )
    then = Followups()
    if not chained:
        then = chains.arm(session, settings, run, now=now, first_index=step.index + 1)
    if not waiting and not then.chains:
        # Arming a segment stamps the run as ``moved`` does (heartbeat, current step and the
        # deadline for its status): one write of the run row, not two.
        touch_run(session, run.id, now, **moved)
    return Done(Proceed(), then)
