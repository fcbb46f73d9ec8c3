"""Schedules: the beat's pass that turns due fire times into launches.

Only an owner's own definitions are scheduled, and only the latest version of each name that
carries a ``schedule`` (a shared definition cannot carry one: it has no owner to run as). The
``schedules`` table (:mod:`orchestration.workflows.schedule_rows`) holds each one's next fire
instant; a pass selects the due ones in SQL and shares itself fairly (issue 30):

- at most ``ORCH_SCHEDULE_FIRES_PER_OWNER`` fires an owner and ``ORCH_SCHEDULE_FIRES_PER_PASS``
  in all, taken round robin across owners (every owner's oldest due fire, then every owner's
  next...), and no new fire once the pass has spent its time budget;
- what a pass leaves is still due, and the next pass takes it first (oldest first): its
  lateness is the fire row's ``recorded_at - fire_at``, shown by ``schedules list``.

Each fire:

- older than ``catchup_window``: recorded ``skipped``, not launched (these are written in
  bulk, up to :data:`MAX_SKIPS_PER_PASS` a schedule, and take no share: they launch nothing);
- the run of an earlier fire still live: ``overlap`` decides (``skip`` records ``skipped``,
  ``enqueue`` launches, ``cancel_previous`` cancels it through the cancel path, then launches);
- else a launch whose request id is :func:`request_id` of (owner, name, version, fire time),
  with the fire's row written in the launch's own transaction.

A fire moves the schedule's ``next_fire_at`` with a compare-and-set in its own transaction,
and the fire row's unique key (owner, name, fire time) backs it: a second beat, a restarted
one or a replayed tick that reaches a fire already taken rolls its launch back.
``now`` is a parameter: tests pass the clock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from orchestration.core.db import constant_in
from orchestration.core.errors import OrchestrationError
from orchestration.core.followups import Done, Transact
from orchestration.core.models import (
    FireStatus,
    Run,
    ScheduleEntry,
    ScheduleFire,
    WorkflowDefinition,
)
from orchestration.core.settings import Settings
from orchestration.core.states import RUN_LIVE, StopReason
from orchestration.limits import suspensions
from orchestration.runs import cancellation, concurrency, launching
from orchestration.workflows import schedule_rows
from orchestration.workflows.schedules import Overlap, ScheduleSpec, next_after

LOG = logging.getLogger(__name__)

#: Most missed fires (older than ``catchup_window``) one pass records per schedule; a longer
#: backlog goes on at the next pass, so one pass stays short.
MAX_SKIPS_PER_PASS = 100


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


@dataclass
class Due:
    """A due schedule as a pass took it: the instant of its next fire (``None`` once another
    writer moved it: a second pass, a pause, a new version)."""

    schedule: Schedule
    at: datetime | None


class _Taken(Exception):
    """Another pass recorded this fire first: the launch in hand is rolled back."""


def request_id(owner: str, name: str, version: int, fire_at: datetime) -> str:
    """The launch's request id: the same for every pass that reaches this fire."""
    key = json.dumps([owner, name, version, fire_at.isoformat()], ensure_ascii=False)
    return "schedule-" + hashlib.sha256(key.encode()).hexdigest()[:40]


def schedule_of(row: WorkflowDefinition) -> Schedule:
    spec = ScheduleSpec.model_validate(row.definition["schedule"])
    return Schedule(row.owner, row.name, row.version, spec, row.definition, row.created_at)


def indexed(owner: str | None = None) -> Any:
    """The ``schedules`` rows (of ``owner``) with their definitions' rows."""
    query = select(ScheduleEntry, WorkflowDefinition).join(
        WorkflowDefinition,
        and_(
            WorkflowDefinition.owner == ScheduleEntry.owner,
            WorkflowDefinition.name == ScheduleEntry.name,
            WorkflowDefinition.version == ScheduleEntry.version,
        ),
    )
    return query if owner is None else query.where(ScheduleEntry.owner == owner)


def take(session: Session, settings: Settings, now: datetime) -> tuple[list[Due], int]:
    """The due schedules a pass takes, in round-robin order (every owner's oldest due fire,
    then every owner's second...), at most ``ORCH_SCHEDULE_FIRES_PER_OWNER`` an owner and
    ``ORCH_SCHEDULE_FIRES_PER_PASS`` in all; and how many schedules were due. One statement
    over the ``next_fire_at`` index: only the definitions taken are read."""
    rank = func.row_number().over(
        partition_by=ScheduleEntry.owner,
        order_by=(ScheduleEntry.next_fire_at, ScheduleEntry.name),
    )
    ranked = (
        select(
            ScheduleEntry.owner,
            ScheduleEntry.name,
            rank.label("rank"),
            func.count().over().label("due"),
        )
        .where(ScheduleEntry.next_fire_at <= now)
        .subquery()
    )
    rows = session.execute(
        indexed()
        .join(
            ranked,
            and_(ranked.c.owner == ScheduleEntry.owner, ranked.c.name == ScheduleEntry.name),
        )
        .add_columns(ranked.c.due)
        .where(ranked.c.rank <= settings.schedule_fires_per_owner)
        .order_by(ranked.c.rank, ScheduleEntry.next_fire_at, ScheduleEntry.owner)
        .limit(settings.schedule_fires_per_pass)
    ).all()
    taken = [Due(schedule_of(definition), entry.next_fire_at) for entry, definition, _ in rows]
    return taken, rows[0][2] if rows else 0


def fire(
    transact: Transact,
    settings: Settings,
    now: datetime,
    *,
    budget: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """One pass: take the due schedules (:func:`take`) and carry out their fires; returns
    counts. With ``budget`` (seconds), no fire starts once the pass has run that long."""
    taken, due = transact(lambda session: Done(take(session, settings, now)))
    return carry_out(transact, settings, taken, now, due=due, budget=budget, clock=clock)


def carry_out(
    transact: Transact,
    settings: Settings,
    taken: list[Due],
    now: datetime,
    *,
    due: int | None = None,
    budget: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Carry out the fires of ``taken`` (read by :func:`take`, perhaps by a pass that another
    one has overtaken since: the compare-and-set on ``next_fire_at`` keeps that harmless),
    round robin: a schedule with more fires due goes back to the end of the line while its
    owner has a share left. ``left``: schedules still due when the pass ends."""
    started = clock()
    report: dict[str, Any] = {
        "due": len(taken) if due is None else due,
        "launched": 0,
        "skipped": 0,
        "failed": 0,
        "errors": 0,
        "left": 0,
        "late_max": 0.0,
    }
    shares: Counter[str] = Counter()
    held = transact(lambda session: Done(suspensions.current(session)))
    line = deque(taken)
    fired = 0
    while line and fired < settings.schedule_fires_per_pass:
        if budget is not None and clock() - started >= budget:
            break
        one = line.popleft()
        owner = one.schedule.owner
        if shares[owner] >= settings.schedule_fires_per_owner:
            continue
        if (suspension := held.get(owner)) is not None:
            report["failed"] += _refuse(transact, one, suspension, now)
            continue
        try:
            report["skipped"] += _skip_missed(transact, one, now)
            if one.at is None or one.at > now:
                continue
            at, one.at = one.at, next_after(one.schedule.spec, one.at)
            shares[owner] += 1
            fired += 1
            outcome = _fire_one(transact, settings, one.schedule, at, now)
        except Exception:
            LOG.exception("schedule %s of %s failed; the next pass tries it again", one, owner)
            report["errors"] += 1
            continue
        if outcome is None:
            one.at = None  # another pass took it, and goes on with this schedule
            continue
        report[outcome.value] += 1
        report["late_max"] = max(report["late_max"], round((now - at).total_seconds(), 3))
        if one.at <= now:
            line.append(one)
    still = sum(1 for one in taken if one.at is not None and one.at <= now)
    report["left"] = report["due"] - len(taken) + still
    return report


def _refuse(transact: Transact, one: Due, suspension: suspensions.Suspension, now: datetime) -> int:
    """Refuse the due fires of a suspended owner's schedule, launching nothing: the latest is
    recorded ``failed`` and the next fire moves past them all, in one transaction, so a pass
    writes one row per suspended schedule however often it fires (a suspension that commits
    after this pass read it is refused by the launch itself). Returns the fires refused."""
    schedule, spec = one.schedule, one.schedule.spec
    fires: list[datetime] = []
    at = one.at
    while at is not None and at <= now and len(fires) < MAX_SKIPS_PER_PASS:
        fires.append(at)
        at = next_after(spec, at)
    if not fires or one.at is None or at is None:
        return 0
    since = suspension.since.isoformat(timespec="seconds")
    reason = f"owner suspended since {since} by {suspension.by}: {suspension.reason}"
    if len(fires) > 1:
        reason += f"; the {len(fires) - 1} due fires before this one were refused with it"
    rid = request_id(schedule.owner, schedule.name, schedule.version, fires[-1])
    first, then = one.at, at

    def write(session: Session) -> Done[bool]:
        if not schedule_rows.advance(
            session, schedule.owner, schedule.name, schedule.version, first, then
        ):
            return Done(False)
        session.add(_row(schedule, fires[-1], rid, FireStatus.FAILED, now, reason=reason))
        return Done(True)

    refused = transact(write)
    one.at = None
    return len(fires) if refused else 0


def _skip_missed(transact: Transact, one: Due, now: datetime) -> int:
    """Record as ``skipped`` the schedule's fires missed by more than its ``catchup_window``
    (up to :data:`MAX_SKIPS_PER_PASS`), in one transaction; moves ``one.at`` past them."""
    schedule, spec = one.schedule, one.schedule.spec

    def missed(at: datetime | None) -> bool:
        return at is not None and (now - at).total_seconds() > spec.catchup_window

    if not missed(one.at):
        return 0

    def write(session: Session) -> Done[tuple[int, datetime | None]]:
        count, at = 0, one.at
        while at is not None and missed(at) and count < MAX_SKIPS_PER_PASS:
            then = next_after(spec, at)
            if not schedule_rows.advance(
                session, schedule.owner, schedule.name, schedule.version, at, then
            ):
                return Done((count, None))
            late = (now - at).total_seconds()
            reason = f"missed by {late:.0f}s, over its catchup_window ({spec.catchup_window}s)"
            rid = request_id(schedule.owner, schedule.name, schedule.version, at)
            session.add(_row(schedule, at, rid, FireStatus.SKIPPED, now, reason=reason))
            count, at = count + 1, then
        return Done((count, at))

    count, one.at = transact(write)
    return count


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
        if transact(lambda session: Done(_taken(session, schedule, at))):
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


def _taken(session: Session, schedule: Schedule, at: datetime) -> bool:
    """Whether ``at`` is no longer the schedule's next fire: another pass took it, or a pause
    or a new version moved it."""
    entry = session.get(ScheduleEntry, (schedule.owner, schedule.name))
    return entry is None or entry.version != schedule.version or entry.next_fire_at != at


def _advanced(session: Session, schedule: Schedule, at: datetime) -> bool:
    """Take the fire at ``at``: the schedule's next fire moves past it (compare-and-set)."""
    then = next_after(schedule.spec, at)
    return schedule_rows.advance(session, schedule.owner, schedule.name, schedule.version, at, then)


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
    """In the launch's transaction: take the fire and write its row, unless another writer
    took it (then the launch is rolled back)."""
    if not _advanced(session, schedule, at):
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
    """A fire that launched nothing; ``None`` when another writer took it first."""

    def write(session: Session) -> Done[bool]:
        if not _advanced(session, schedule, at):
            return Done(False)
        session.add(_row(schedule, at, rid, status, now, reason=reason[:2000]))
        return Done(True)

    return status if transact(write) else None
