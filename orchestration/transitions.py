"""The one writer of status.

Every run and step status change goes through :func:`transition_run` or
:func:`transition_step`: a compare-and-set ``UPDATE … WHERE id = :id AND status = :seen`` that
also writes the journal row in the caller's transaction. A terminal status has no outgoing
transitions in :mod:`orchestration.states`, so no writer (a late worker, a zombie woken by
SIGCONT, a second beat) can move a run or a step out of it. Field updates that are not status
changes go through :func:`touch_run` / :func:`touch_step`, which are guarded the same way: they
only ever match a live row.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from orchestration.errors import IllegalTransition, RunNotFound
from orchestration.models import Run, RunEvent, Step
from orchestration.states import (
    RUN_LIVE,
    RUN_TERMINAL,
    RUN_TRANSITIONS,
    STEP_LIVE,
    STEP_TERMINAL,
    STEP_TRANSITIONS,
    STOP_REASONS,
    RunStatus,
    StepStatus,
    StopReason,
)

#: How many times a compare-and-set is retried after losing a race to another writer whose
#: change still leaves the target reachable (e.g. ``running`` → ``parked`` under us).
_CAS_TRIES = 5

_LIVE_RUN = [s.value for s in RUN_LIVE]
#: Built once: every transition writes one (binding is cheaper than building it again).
_JOURNAL = insert(RunEvent).values(
    {
        name: bindparam(name)
        for name in ("run_id", "step_id", "from_status", "to_status", "cause", "stop_reason", "at")
    }
)
_LIVE_STEP = [s.value for s in STEP_LIVE]


def transition_run(
    session: Session,
    run_id: str,
    to: RunStatus,
    *,
    cause: str,
    now: datetime,
    stop_reason: StopReason | None = None,
    expect: Collection[RunStatus] | None = None,
    values: Mapping[str, Any] | None = None,
    seen: RunStatus | None = None,
) -> RunStatus:
    """Move run ``run_id`` to ``to`` and journal it; return the status it left.

    ``expect`` narrows the allowed sources further (e.g. only from ``parked``). ``values`` are
    other columns written in the same statement. ``seen`` is the status the caller read in
    this transaction (under the row's lock): the first compare-and-set is tried on it without
    reading the status again. A terminal ``to`` needs a ``stop_reason``
    allowed for it and sets ``finished_at``.

    Raises :class:`IllegalTransition` when the current status does not allow ``to`` (or not
    in ``expect``), and :class:`RunNotFound` when there is no such run.
    """
    if to in RUN_TERMINAL:
        if stop_reason not in STOP_REASONS[to]:
            raise ValueError(f"stop_reason {stop_reason!r} does not go with {to.value!r}")
    elif stop_reason is not None:
        raise ValueError("only a terminal status carries a stop_reason")
    row_values: dict[str, Any] = {"status": to.value, "updated_at": now, **(values or {})}
    if to in RUN_TERMINAL:
        row_values.update(
            stop_reason=stop_reason.value if stop_reason else None,
            finished_at=now,
            deadline_at=None,
            park_reason=None,
            parked_since=None,
            waiting_until=None,
        )
    if to is RunStatus.RUNNING:
        row_values.setdefault("started_at", func.coalesce(Run.started_at, now))
    current: str | None = None
    for _ in range(_CAS_TRIES):
        if seen is None:
            current = session.execute(select(Run.status).where(Run.id == run_id)).scalar()
            if current is None:
                raise RunNotFound(run_id)
            seen = RunStatus(current)
        current = seen.value
        if to not in RUN_TRANSITIONS[seen] or (expect is not None and seen not in expect):
            raise IllegalTransition("run", run_id, current, to.value)
        done = session.execute(
            update(Run)
            .where(Run.id == run_id, Run.status == seen.value)
            .values(**row_values)
            .execution_options(synchronize_session=False)
        )
        if done.rowcount == 1:  # type: ignore[attr-defined]
            _journal(session, run_id, None, seen.value, to.value, cause, now, row_values)
            return seen
        seen = None
    raise IllegalTransition("run", run_id, current, to.value)


class StepKey(Protocol):
    """What a step write needs to name its row and journal it (a ``Step``, or what the
    execution's fence returned)."""

    @property
    def pk(self) -> int: ...
    @property
    def run_id(self) -> str: ...
    @property
    def step_id(self) -> str: ...


def transition_step(
    session: Session,
    step: StepKey,
    to: StepStatus,
    *,
    cause: str,
    now: datetime,
    expect: Collection[StepStatus] | None = None,
    values: Mapping[str, Any] | None = None,
    seen: StepStatus | None = None,
) -> StepStatus:
    """Move ``step`` to ``to`` and journal it; return the status it left.

    The row is compared and set in SQL (``step`` is only used for its key, run and id); raises
    :class:`IllegalTransition` when the current status does not allow ``to``. ``seen`` as for
    :func:`transition_run`.
    """
    row_values: dict[str, Any] = {"status": to.value, "updated_at": now, **(values or {})}
    if to in STEP_TERMINAL:
        row_values.update(finished_at=now, next_poll_at=None)
    if to is StepStatus.RUNNING:
        row_values.setdefault("started_at", func.coalesce(Step.started_at, now))
    current: str | None = None
    for _ in range(_CAS_TRIES):
        if seen is None:
            current = session.execute(select(Step.status).where(Step.pk == step.pk)).scalar()
            if current is None:
                raise IllegalTransition("step", step.step_id, None, to.value)
            seen = StepStatus(current)
        current = seen.value
        if to not in STEP_TRANSITIONS[seen] or (expect is not None and seen not in expect):
            raise IllegalTransition("step", f"{step.run_id}/{step.step_id}", current, to.value)
        done = session.execute(
            update(Step)
            .where(Step.pk == step.pk, Step.status == seen.value)
            .values(**row_values)
            .execution_options(synchronize_session=False)
        )
        if done.rowcount == 1:  # type: ignore[attr-defined]
            _journal(session, step.run_id, step.step_id, seen.value, to.value, cause, now, {})
            return seen
        seen = None
    raise IllegalTransition("step", f"{step.run_id}/{step.step_id}", current, to.value)


def _journal(
    session: Session,
    run_id: str,
    step_id: str | None,
    from_status: str,
    to_status: str,
    cause: str,
    now: datetime,
    values: Mapping[str, Any],
) -> None:
    """The journal row of a transition, in the same transaction (one INSERT, no flush)."""
    session.execute(
        _JOURNAL,
        {
            "run_id": run_id,
            "step_id": step_id,
            "from_status": from_status,
            "to_status": to_status,
            "cause": cause,
            "stop_reason": values.get("stop_reason"),
            "at": now,
        },
    )


def touch_run(session: Session, run_id: str, now: datetime, **values: Any) -> bool:
    """Write non-status columns of a live run; ``False`` when the run is terminal (or gone)."""
    done = session.execute(
        update(Run)
        .where(Run.id == run_id, Run.status.in_(_LIVE_RUN))
        .values(updated_at=now, **values)
        .execution_options(synchronize_session=False)
    )
    return bool(done.rowcount == 1)  # type: ignore[attr-defined]


def lock_run(session: Session, run_id: str, now: datetime) -> bool:
    """Take the run row's write lock for the rest of the transaction; ``False`` if terminal.

    An UPDATE, not ``SELECT … FOR UPDATE``: SQLite ignores the latter, and a step that is
    starting a provider turn holds this lock until the turn is recorded, so whoever takes it
    next sees the started step (and its turn to cancel).
    """
    return touch_run(session, run_id, now)


def touch_step(session: Session, step: StepKey, now: datetime, **values: Any) -> bool:
    """Write non-status columns of a live step; ``False`` when the step is terminal."""
    done = session.execute(
        update(Step)
        .where(Step.pk == step.pk, Step.status.in_(_LIVE_STEP))
        .values(updated_at=now, **values)
        .execution_options(synchronize_session=False)
    )
    return bool(done.rowcount == 1)  # type: ignore[attr-defined]
