"""The ``schedules`` table: one row per registered schedule, with the instant of its next fire.

It is kept where a schedule changes: registering a version (:func:`admit` checks it before
the registry writes, :func:`registered` indexes it in the same transaction), pausing and
resuming (:func:`paused`), and every fire (:func:`advance`, in the fire's own transaction).
The beat's pass selects due schedules by ``next_fire_at`` (an index) instead of reading every
definition's latest version (issue 30: at 10,000 schedules that read alone outlasted the
pass).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestration.core.errors import LimitExceeded
from orchestration.core.models import ScheduleEntry, ScheduleFire, SchedulePause
from orchestration.core.settings import Settings
from orchestration.limits import admission
from orchestration.workflows.schedules import ScheduleSpec, check, next_after


def cursor(session: Session, owner: str, name: str) -> datetime | None:
    """The latest recorded fire of the schedule: where its next fires are counted from."""
    return session.scalar(
        select(func.max(ScheduleFire.fire_at)).where(
            ScheduleFire.owner == owner, ScheduleFire.name == name
        )
    )


def admit(session: Session, settings: Settings, owner: str, definition: dict[str, Any]) -> None:
    """Check, before anything is written, that the owner may register ``definition``'s
    schedule. Raises :class:`ValidationError` (``schedule.every``) for an ``every`` shorter
    than ``ORCH_SCHEDULE_INTERVAL``, and :class:`LimitExceeded` (``schedule``) when a new
    schedule would pass ``ORCH_MAX_SCHEDULES_PER_OWNER``."""
    body = definition.get("schedule")
    if body is None:
        return
    check(ScheduleSpec.model_validate(body), settings)
    if session.get(ScheduleEntry, (owner, definition["name"])) is None:
        _within_budget(session, settings, owner)


def registered(
    session: Session, owner: str, name: str, version: int, definition: dict[str, Any], now: datetime
) -> None:
    """Index ``version``, just registered as the latest of the owner's ``name`` (after
    :func:`admit`): its schedule fires from the latest recorded fire (else from now); a
    version without one leaves the table."""
    row = session.get(ScheduleEntry, (owner, name))
    body = definition.get("schedule")
    if body is None:
        if row is not None:
            session.delete(row)
        return
    spec = ScheduleSpec.model_validate(body)
    at = None
    if session.get(SchedulePause, (owner, name)) is None:
        at = next_after(spec, cursor(session, owner, name) or now)
    if row is not None:
        row.version, row.next_fire_at = version, at
        return
    try:
        with session.begin_nested():  # a concurrent registration of the name indexed it first
            session.add(ScheduleEntry(owner=owner, name=name, version=version, next_fire_at=at))
    except IntegrityError:
        session.execute(
            update(ScheduleEntry)
            .where(ScheduleEntry.owner == owner, ScheduleEntry.name == name)
            .values(version=version, next_fire_at=at)
        )


def _within_budget(session: Session, settings: Settings, owner: str) -> None:
    admission.serialised(session, owner)  # a concurrent registration's schedule is counted
    count = session.scalar(
        select(func.count()).select_from(ScheduleEntry).where(ScheduleEntry.owner == owner)
    )
    limit = settings.max_schedules_per_owner
    if (count or 0) >= limit:
        raise LimitExceeded(
            "schedule",
            f"owner {owner!r} has {count} schedules, the limit of {limit} "
            "(ORCH_MAX_SCHEDULES_PER_OWNER); register a version without schedule: to drop one",
        )


def paused(
    session: Session, owner: str, name: str, spec: ScheduleSpec, start: datetime | None
) -> None:
    """Stop the schedule's fires (``start`` ``None``) or start them again after ``start``."""
    at = None if start is None else next_after(spec, start)
    session.execute(
        update(ScheduleEntry)
        .where(ScheduleEntry.owner == owner, ScheduleEntry.name == name)
        .values(next_fire_at=at)
    )


def advance(
    session: Session, owner: str, name: str, version: int, at: datetime, then: datetime
) -> bool:
    """Move the schedule's next fire from ``at`` to ``then``: a compare-and-set, so a fire is
    taken by one pass only, and not at all once the schedule was paused or registered again
    since the pass selected it. Returns whether it moved."""
    moved = session.execute(
        update(ScheduleEntry)
        .where(
            ScheduleEntry.owner == owner,
            ScheduleEntry.name == name,
            ScheduleEntry.version == version,
            ScheduleEntry.next_fire_at == at,
        )
        .values(next_fire_at=then)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(moved, "rowcount", 0) or 0) == 1
