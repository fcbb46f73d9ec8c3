"""Schedules: the beat's pass that turns a definition's due fire times into launches.

Only an owner's own definitions are scheduled, and only the latest version of each name that
carries a ``schedule`` (a shared definition cannot carry one: it has no owner to run as). A
pass plans, per schedule, the fire instants after its cursor (the latest recorded fire, else
the registration of that version) up to ``now``, then carries out each fire:

- older than ``catchup_window``: recorded ``skipped``, not launched;
- the run of an earlier fire still live: ``overlap`` decides (``skip`` records ``skipped``,
  ``enqueue`` launches, ``cancel_previous`` cancels it through the cancel path, then launches);
- else a launch whose request id is :func:`request_id` of (owner, name, version, fire time),
  with the fire's row written in the launch's own transaction.

The row's unique key (owner, name, fire time) makes every fire happen once: a second beat, a
restarted one or a replayed tick that reaches a fire already recorded rolls its launch back.
``now`` is a parameter: tests pass the clock.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestration.core.db import constant_in
from orchestration.core.errors import OrchestrationError, ValidationError
from orchestration.core.followups import Done, Transact
from orchestration.core.models import (
    FireStatus,
    Run,
    ScheduleFire,
    SchedulePause,
    WorkflowDefinition,
)
from orchestration.core.settings import Settings
from orchestration.core.states import RUN_LIVE, StopReason
from orchestration.limits import suspensions
from orchestration.runs import cancellation, concurrency, launching
from orchestration.workflows import registry
from orchestration.workflows.schedules import Overlap, ScheduleSpec, fires_after

#: Most fires one pass carries out per schedule; a longer backlog goes on at the next pass
#: (the cursor is the latest recorded fire), so one pass stays short.
MAX_FIRES_PER_PASS = 100


@dataclass(frozen=True)
class Schedule:
    """The schedule of the latest version of an owner's definition."""

    owner: str
    name: str
    version: int
    spec: ScheduleSpec
    definition: dict[str, Any]
    #: When that version was registered: where a schedule without fires starts.
    registered_at: datetime


@dataclass(frozen=True)
class Planned:
    """A schedule as one pass found it: where its fires start, and whether it is paused."""

    schedule: Schedule
    cursor: datetime
    paused: bool


class _Taken(Exception):
    """Another pass recorded this fire first: the launch in hand is rolled back."""


def request_id(owner: str, name: str, version: int, fire_at: datetime) -> str:
    """The launch's request id: the same for every pass that reaches this fire."""
    key = json.dumps([owner, name, version, fire_at.isoformat()], ensure_ascii=False)
    return "schedule-" + hashlib.sha256(key.encode()).hexdigest()[:40]


def scheduled(session: Session, owner: str | None = None) -> list[Schedule]:
    """Every schedule (of ``owner``), by owner and name."""
    latest = (
        select(
            WorkflowDefinition.owner,
            WorkflowDefinition.name,
            func.max(WorkflowDefinition.version).label("version"),
        )
        .where(WorkflowDefinition.owner != registry.SHARED)
        .group_by(WorkflowDefinition.owner, WorkflowDefinition.name)
    )
    if owner is not None:
        latest = latest.where(WorkflowDefinition.owner == owner)
    last = latest.subquery()
    rows = session.scalars(
        select(WorkflowDefinition)
        .join(
            last,
            and_(
                WorkflowDefinition.owner == last.c.owner,
                WorkflowDefinition.name == last.c.name,
                WorkflowDefinition.version == last.c.version,
            ),
        )
        .order_by(WorkflowDefinition.owner, WorkflowDefinition.name)
    )
    return [_schedule(row) for row in rows if "schedule" in row.definition]


def _schedule(row: WorkflowDefinition) -> Schedule:
    spec = ScheduleSpec.model_validate(row.definition["schedule"])
    return Schedule(row.owner, row.name, row.version, spec, row.definition, row.created_at)


def plan(session: Session, owner: str | None = None) -> list[Planned]:
    """The schedules with their cursors and pauses, read in one transaction."""
    found = scheduled(session, owner)
    last = func.max(ScheduleFire.fire_at)
    cursors = {
        (row[0], row[1]): row[2]
        for row in session.execute(
            select(ScheduleFire.owner, ScheduleFire.name, last).group_by(
                ScheduleFire.owner, ScheduleFire.name
            )
        )
    }
    paused = {
        (row[0], row[1]) for row in session.execute(select(SchedulePause.owner, SchedulePause.name))
    }
    return [
        Planned(
            one,
            cursors.get((one.owner, one.name)) or one.registered_at,
            (one.owner, one.name) in paused,
        )
        for one in found
    ]


def due(planned: Planned, now: datetime) -> Iterator[datetime]:
    """The fire instants after the cursor up to ``now`` (at most a pass's worth)."""
    times = itertools.takewhile(
        lambda at: at <= now, fires_after(planned.schedule.spec, planned.cursor)
    )
    return itertools.islice(times, MAX_FIRES_PER_PASS)


def fire(transact: Transact, settings: Settings, now: datetime) -> dict[str, int]:
    """One pass: carry out every due fire of every schedule; returns counts."""
    return carry_out(transact, settings, transact(lambda session: Done(plan(session))), now)


def carry_out(
    transact: Transact, settings: Settings, planned: list[Planned], now: datetime
) -> dict[str, int]:
    """Carry out the due fires of ``planned`` (read by :func:`plan`, perhaps by a pass that
    another one has overtaken since: the fire rows keep that harmless)."""
    report = {"schedules": len(planned), "paused": 0, "launched": 0, "skipped": 0, "failed": 0}
    held = transact(lambda session: Done(suspensions.current(session)))
    for one in planned:
        if one.paused:
            report["paused"] += 1
            continue
        if (suspension := held.get(one.schedule.owner)) is not None:
            _refuse(transact, one, suspension, now, report)
            continue
        for at in due(one, now):
            outcome = _fire_one(transact, settings, one.schedule, at, now)
            if outcome is not None:
                report[outcome.value] += 1
    return report


def _refuse(
    transact: Transact,
    planned: Planned,
    suspension: suspensions.Suspension,
    now: datetime,
    report: dict[str, int],
) -> None:
    """Refuse the due fires of a suspended owner's schedule, launching nothing: the latest
    is recorded ``failed`` (which moves the cursor past them all), so a pass writes one row
    per suspended schedule however often it fires (a suspension that commits after this
    read is refused by the launch itself)."""
    fires = list(due(planned, now))
    if not fires:
        return
    schedule, since = planned.schedule, suspension.since.isoformat(timespec="seconds")
    reason = f"owner suspended since {since} by {suspension.by}: {suspension.reason}"
    if len(fires) > 1:
        reason += f"; the {len(fires) - 1} due fires before this one were refused with it"
    rid = request_id(schedule.owner, schedule.name, schedule.version, fires[-1])
    if _record(transact, schedule, fires[-1], rid, FireStatus.FAILED, now, reason=reason):
        report["failed"] += len(fires)


def _fire_one(
    transact: Transact, settings: Settings, schedule: Schedule, at: datetime, now: datetime
) -> FireStatus | None:
    """One fire; what it came to, or ``None`` when another pass had recorded it."""
    spec, rid = schedule.spec, request_id(schedule.owner, schedule.name, schedule.version, at)
    late = (now - at).total_seconds()
    if late > spec.catchup_window:
        reason = f"missed by {late:.0f}s, over its catchup_window ({spec.catchup_window}s)"
        return _record(transact, schedule, at, rid, FireStatus.SKIPPED, now, reason=reason)
    live = transact(lambda session: Done(_live_before(session, schedule, at)))
    if live and spec.overlap is Overlap.SKIP:
        reason = f"run {live[0]} of an earlier fire is live (overlap: skip)"
        return _record(transact, schedule, at, rid, FireStatus.SKIPPED, now, reason=reason)
    if live and spec.overlap is Overlap.CANCEL_PREVIOUS:
        if transact(lambda session: Done(_recorded(session, schedule, at))):
            return None  # the pass that recorded it cancelled what it had to
        for run_id in live:
            _cancel(transact, settings, schedule, run_id, now)
    try:
        launching.launch_then(
            transact,
            settings,
            schedule.definition,
            spec.args,
            owner=schedule.owner,
            request_id=rid,
            concurrency_key=None,
            on_conflict=concurrency.OnConflict.REJECT,
            now=now,
            read=lambda session, made: _claim(session, schedule, at, rid, made.run.id, now),
            version=schedule.version,
        )
    except _Taken:
        return None
    except OrchestrationError as exc:
        # A limit, a held key, args the schema no longer takes: recorded, not retried.
        reason = f"{exc.code}: {exc}"
        return _record(transact, schedule, at, rid, FireStatus.FAILED, now, reason=reason)
    return FireStatus.LAUNCHED


def _cancel(
    transact: Transact, settings: Settings, schedule: Schedule, run_id: str, now: datetime
) -> None:
    """End a run of an earlier fire as ``orchestration cancel`` does."""
    by = f"schedule {schedule.name} (overlap: cancel_previous)"
    requested = cancellation.request(transact, settings, run_id, now=now, by=by, stop=True)
    if requested is not None:
        cancellation.finish(
            transact,
            settings,
            run_id,
            now=now,
            stop_reason=StopReason.CANCEL_REQUESTED,
            cause=f"cancelled by the next fire of {by}",
            revoke=True,
            live=requested.live,
        )


def _live_before(session: Session, schedule: Schedule, at: datetime) -> list[str]:
    """The live runs of this schedule's fires before ``at``, newest first."""
    return list(
        session.scalars(
            select(ScheduleFire.run_id)
            .join(Run, Run.id == ScheduleFire.run_id)
            .where(
                ScheduleFire.owner == schedule.owner,
                ScheduleFire.name == schedule.name,
                ScheduleFire.fire_at < at,
                constant_in(Run.status, RUN_LIVE),
            )
            .order_by(ScheduleFire.fire_at.desc())
        )
    )


def _recorded(session: Session, schedule: Schedule, at: datetime) -> bool:
    return (
        session.scalar(
            select(ScheduleFire.pk).where(
                ScheduleFire.owner == schedule.owner,
                ScheduleFire.name == schedule.name,
                ScheduleFire.fire_at == at,
            )
        )
        is not None
    )


def _row(
    schedule: Schedule, at: datetime, rid: str, status: FireStatus, now: datetime, **values: Any
) -> ScheduleFire:
    return ScheduleFire(
        owner=schedule.owner,
        name=schedule.name,
        version=schedule.version,
        fire_at=at,
        status=status.value,
        request_id=rid,
        recorded_at=now,
        **values,
    )


def _claim(
    session: Session, schedule: Schedule, at: datetime, rid: str, run_id: str, now: datetime
) -> str:
    """In the launch's transaction: the fire's row, unless another pass wrote it (then the
    launch is rolled back; a concurrent insert fails the commit and the launch reads again)."""
    if _recorded(session, schedule, at):
        raise _Taken
    session.add(_row(schedule, at, rid, FireStatus.LAUNCHED, now, run_id=run_id))
    session.flush()
    return run_id


def _record(
    transact: Transact,
    schedule: Schedule,
    at: datetime,
    rid: str,
    status: FireStatus,
    now: datetime,
    *,
    reason: str,
) -> FireStatus | None:
    """A fire that launched nothing; ``None`` when another pass recorded it first."""

    def write(session: Session) -> Done[bool]:
        try:
            with session.begin_nested():
                session.add(_row(schedule, at, rid, status, now, reason=reason[:2000]))
        except IntegrityError:
            return Done(False)
        return Done(True)

    return status if transact(write) else None


def pause(session: Session, owner: str, name: str, now: datetime) -> bool:
    """Pause the owner's schedule ``name``; whether it was running. Raises
    :class:`ValidationError` (field ``name``) when the owner has no such schedule."""
    _own_schedule(session, owner, name)
    if session.get(SchedulePause, (owner, name)) is not None:
        return False
    try:
        with session.begin_nested():  # a concurrent pause got there first
            session.add(SchedulePause(owner=owner, name=name, paused_at=now))
    except IntegrityError:
        return False
    return True


def resume(session: Session, owner: str, name: str) -> bool:
    """Resume it; whether it was paused. The fires missed meanwhile follow the catch-up
    rules at the next pass (inside ``catchup_window``: launched; older: skipped)."""
    _own_schedule(session, owner, name)
    row = session.get(SchedulePause, (owner, name))
    if row is None:
        return False
    session.delete(row)
    return True


def _own_schedule(session: Session, owner: str, name: str) -> Schedule:
    for one in scheduled(session, owner):
        if one.name == name:
            return one
    raise ValidationError(
        "name", f"owner {owner!r} has no registered workflow {name!r} with a schedule"
    )


def listing(session: Session, owner: str, now: datetime, *, last: int = 5) -> list[dict[str, Any]]:
    """The owner's schedules: the next fire times, the pause, and the latest fires with the
    runs they made (``schedules list``)."""
    shown = []
    for one in plan(session, owner):
        schedule = one.schedule
        fires = session.execute(
            select(ScheduleFire, Run.status)
            .outerjoin(Run, Run.id == ScheduleFire.run_id)
            .where(ScheduleFire.owner == owner, ScheduleFire.name == schedule.name)
            .order_by(ScheduleFire.fire_at.desc())
            .limit(last)
        ).all()
        upcoming = itertools.islice(fires_after(schedule.spec, max(now, one.cursor)), 3)
        pause_row = session.get(SchedulePause, (owner, schedule.name))
        shown.append(
            {
                "name": schedule.name,
                "ref": f"{schedule.name}@{schedule.version}",
                "schedule": schedule.spec.as_dict(),
                "paused": one.paused,
                "paused_at": pause_row.paused_at.isoformat() if pause_row else None,
                "next_fires": [at.isoformat() for at in upcoming],
                "last_fires": [
                    {
                        "fire_at": fire.fire_at.isoformat(),
                        "status": fire.status,
                        "version": fire.version,
                        "run_id": fire.run_id,
                        "run_status": status,
                        "reason": fire.reason,
                    }
                    for fire, status in fires
                ],
            }
        )
    return shown
