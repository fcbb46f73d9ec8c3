"""The fleet as the database sees it, for the operator's fleet page: the workers that ran
steps in the last hour, the sweeper's passes, live runs by health, runs started and ended
per minute, poll lateness and sweep time per minute (``fleet_series``), and the busiest
owners' use of their budgets.

Read from the rows (the truth that outlives any process): a worker is "seen" when it last
stamped a step it executes, so one that died is shown with the age of its last stamp. What
only the broker knows (queue depth, pool sizes) comes from ``runtime.broker_probe``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from orchestration.core import health as judgement
from orchestration.core.models import Run, Step, SweeperBeat
from orchestration.core.settings import Settings
from orchestration.limits import owner_budgets
from orchestration.reads import summaries
from orchestration.upkeep import fleet_series

#: How far back the page looks.
WINDOW = timedelta(hours=1)
#: Keys of a sweeper report that say when and how long, not what it did.
_NOT_ACTIONS = frozenset({"at", "seconds"})


@dataclass(frozen=True)
class Worker:
    """A worker (Celery node name) that executed steps in the window."""

    name: str
    last_seen: datetime
    #: Live runs whose current step it executes now.
    active_steps: int
    #: Step executions it stamped in the window (steps, not polls).
    steps: int


@dataclass(frozen=True)
class Fleet:
    """One reading of the fleet at ``now``."""

    now: datetime
    workers: list[Worker]
    sweepers: list[dict[str, Any]]
    #: Live runs by health, and how many are past their ``deadline_at``.
    health: dict[str, int]
    past_deadline: int
    #: Runs created and ended in each minute of the window, oldest first (60 each).
    started: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    #: Poll lateness and sweep pass times of each minute (``None``: nothing reported).
    poll_lateness: list[fleet_series.Summary | None] = field(default_factory=list)
    sweep_seconds: list[fleet_series.Summary | None] = field(default_factory=list)
    #: The owners with the most live runs (``ORCH_METRICS_TOP_OWNERS``), each with its
    #: budgets' use against their limits.
    owners: list[tuple[str, list[owner_budgets.Use]]] = field(default_factory=list)


def _per_minute(times: Sequence[datetime | None], start: datetime, minutes: int) -> list[int]:
    counts = [0] * minutes
    for when in times:
        if when is None:
            continue
        slot = int((when - start).total_seconds() // 60)
        if 0 <= slot < minutes:
            counts[slot] += 1
    return counts


def snapshot(session: Session, settings: Settings, now: datetime) -> Fleet:
    """The fleet at ``now``: a handful of statements, each bounded by the window or by the
    live rows (through their indexes)."""
    since = now - WINDOW
    live_step = and_(Step.run_id == Run.id, Step.index == Run.current_step, summaries.live())
    workers = [
        Worker(str(name), last_seen, int(active or 0), int(steps))
        for name, last_seen, active, steps in session.execute(
            select(
                Step.worker,
                func.max(Step.updated_at),
                func.sum(case((live_step, 1), else_=0)),
                func.count(),
            )
            .select_from(Step)
            .join(Run, Run.id == Step.run_id)
            .where(Step.worker.is_not(None), Step.updated_at >= since)
            .group_by(Step.worker)
            .order_by(func.max(Step.updated_at).desc())
        )
    ]
    health = judgement.expression()
    by_health: dict[str, int] = {}
    past = 0
    for state, count, late in session.execute(
        select(
            health,
            func.count(),
            func.coalesce(func.sum(case((Run.deadline_at < now, 1), else_=0)), 0),
        )
        .where(summaries.live())
        .group_by(health),
        judgement.params(settings, now),
    ):
        by_health[str(state)] = int(count)
        past += int(late)
    sweepers = [
        {
            "name": beat.name,
            "last_pass_at": beat.last_pass_at,
            "age_seconds": (now - beat.last_pass_at).total_seconds(),
            "seconds": beat.last_pass_seconds,
            "passes": beat.passes,
            "did": {
                key: value
                for key, value in (beat.last_report or {}).items()
                if value and key not in _NOT_ACTIONS
            },
        }
        for beat in session.scalars(select(SweeperBeat).order_by(SweeperBeat.name))
    ]
    minutes = int(WINDOW.total_seconds() // 60)
    start = now - WINDOW
    created = list(session.scalars(select(Run.created_at).where(Run.created_at >= start)))
    finished = list(
        session.scalars(
            select(Run.finished_at).where(summaries.terminal(), Run.finished_at >= start)
        )
    )
    # The current minute is still being counted (a worker writes it once it is over): the
    # series' window ends at the start of this minute.
    series_start = fleet_series.minute_of(now) - WINDOW
    return Fleet(
        now,
        workers,
        sweepers,
        by_health,
        past,
        _per_minute(created, start, minutes),
        _per_minute(finished, start, minutes),
        fleet_series.per_minute(session, fleet_series.Series.POLL_LATENESS, series_start, minutes),
        fleet_series.per_minute(session, fleet_series.Series.SWEEP_SECONDS, series_start, minutes),
        owner_budgets.busiest(session, settings, settings.metrics_top_owners),
    )
