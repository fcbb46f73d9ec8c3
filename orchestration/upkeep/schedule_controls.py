"""What an owner does to its schedules: list them, pause one, resume it.

A pause takes the schedule out of the beat's passes (its ``next_fire_at`` is cleared); a
resume puts it back from its latest fire, so the fires missed meanwhile follow the catch-up
rules (:mod:`orchestration.upkeep.schedules`).
"""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestration.core.errors import ValidationError
from orchestration.core.models import Run, ScheduleEntry, ScheduleFire, SchedulePause
from orchestration.upkeep import schedules
from orchestration.workflows import schedule_rows
from orchestration.workflows.schedules import fires_after


def pause(session: Session, owner: str, name: str, now: datetime) -> bool:
    """Pause the owner's schedule ``name``; whether it was running. Raises
    :class:`ValidationError` (field ``name``) when the owner has no such schedule."""
    schedule = _own_schedule(session, owner, name)
    if session.get(SchedulePause, (owner, name)) is not None:
        return False
    try:
        with session.begin_nested():  # a concurrent pause got there first
            session.add(SchedulePause(owner=owner, name=name, paused_at=now))
    except IntegrityError:
        return False
    schedule_rows.paused(session, owner, name, schedule.spec, None)
    return True


def resume(session: Session, owner: str, name: str) -> bool:
    """Resume it; whether it was paused. The fires missed meanwhile follow the catch-up
    rules at the next pass (inside ``catchup_window``: launched; older: skipped)."""
    schedule = _own_schedule(session, owner, name)
    row = session.get(SchedulePause, (owner, name))
    if row is None:
        return False
    session.delete(row)
    start = schedule_rows.cursor(session, owner, name) or schedule.registered_at
    schedule_rows.paused(session, owner, name, schedule.spec, start)
    return True


def _own_schedule(session: Session, owner: str, name: str) -> schedules.Schedule:
    found = session.execute(schedules.indexed(owner).where(ScheduleEntry.name == name)).first()
    if found is None:
        raise ValidationError(
            "name", f"owner {owner!r} has no registered workflow {name!r} with a schedule"
        )
    return schedules.schedule_of(found[1])


def listing(session: Session, owner: str, now: datetime, *, last: int = 5) -> list[dict[str, Any]]:
    """The owner's schedules: the next fire times, how far behind a due fire is, the pause,
    and the latest fires with the runs they made and how late each was (``schedules
    list``)."""
    shown = []
    for entry, definition in session.execute(schedules.indexed(owner).order_by(ScheduleEntry.name)):
        schedule = schedules.schedule_of(definition)
        fires = session.execute(
            select(ScheduleFire, Run.status)
            .outerjoin(Run, Run.id == ScheduleFire.run_id)
            .where(ScheduleFire.owner == owner, ScheduleFire.name == schedule.name)
            .order_by(ScheduleFire.fire_at.desc())
            .limit(last)
        ).all()
        cursor = fires[0][0].fire_at if fires else schedule.registered_at
        upcoming = itertools.islice(fires_after(schedule.spec, max(now, cursor)), 3)
        pause_row = session.get(SchedulePause, (owner, schedule.name))
        due_at = entry.next_fire_at
        shown.append(
            {
                "name": schedule.name,
                "ref": f"{schedule.name}@{schedule.version}",
                "schedule": schedule.spec.as_dict(),
                "paused": pause_row is not None,
                "paused_at": pause_row.paused_at.isoformat() if pause_row else None,
                "next_fires": [at.isoformat() for at in upcoming],
                # A due fire a pass has not reached yet (its owner's share was spent).
                "behind_seconds": (
                    round((now - due_at).total_seconds(), 3)
                    if due_at is not None and due_at < now
                    else 0.0
                ),
                "last_fires": [
                    {
                        "fire_at": fire.fire_at.isoformat(),
                        "status": fire.status,
                        "version": fire.version,
                        "run_id": fire.run_id,
                        "run_status": status,
                        "late_seconds": round((fire.recorded_at - fire.fire_at).total_seconds(), 3),
                        "reason": fire.reason,
                    }
                    for fire, status in fires
                ],
            }
        )
    return shown
