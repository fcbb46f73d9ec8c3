"""Prometheus metrics computed from the database at scrape time, plus the process's own.

The database is the truth about runs, so these are read from it, not counted in a process
that may restart: live runs by status and health (health is derived, so live rows are read
and derived, through the partial index ``ix_runs_live``), terminal runs by status, terminal
transitions by stop reason (from ``run_events``), cancel-to-terminal latency, live runs past
their ``deadline_at`` (the sweeper's promise is that this reads 0), and the sweeper's age.

Terminal counts, stop reasons and the latency histogram scan history, aggregated in SQL; a
scrape every 15-60 s is cheap for up to millions of runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.orm import Session, lazyload

from orchestration.db import session_scope, utcnow
from orchestration.health import derive
from orchestration.liveness import sweeper_age
from orchestration.models import Run, RunEvent
from orchestration.settings import Settings
from orchestration.states import RUN_LIVE, RUN_TERMINAL, STOP_REASONS, Health, RunStatus

LOG = logging.getLogger(__name__)

#: Buckets of the cancel-to-terminal histogram (seconds): a hard cancel lands in well under a
#: second; a graceful one may take up to ``ORCH_CANCEL_GRACE`` plus a sweep.
CANCEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

_LIVE = sorted(s.value for s in RUN_LIVE)
_TERMINAL = sorted(s.value for s in RUN_TERMINAL)


def _seconds(session: Session, start: Any, end: Any) -> ColumnElement[Any]:
    """``end - start`` in seconds, in SQL (PostgreSQL or SQLite)."""
    if session.get_bind().dialect.name == "postgresql":
        return func.extract("epoch", end - start)
    return (func.julianday(end) - func.julianday(start)) * 86400.0


class RunMetrics(Collector):
    """A collector that reads the runs tables at each scrape."""

    def __init__(self, settings: Settings, clock: Callable[[], datetime] = utcnow) -> None:
        self.settings = settings
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "orchestration_metrics_database_up",
            "1 if the last scrape could read the database, else 0.",
        )
        try:
            families = list(self._from_database(self.clock()))
        except Exception:
            LOG.exception("metrics: cannot read the database")
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _from_database(self, now: datetime) -> Iterator[Metric]:
        runs = GaugeMetricFamily(
            "orchestration_runs",
            "Runs by status and health: live runs (health derived now) and terminal runs "
            "(health 'ended').",
            labels=["status", "health"],
        )
        counts: dict[tuple[str, str], int] = {
            (status, health.value): 0
            for status in _LIVE
            for health in Health
            if health is not Health.ENDED
        }
        counts.update({(status, Health.ENDED.value): 0 for status in _TERMINAL})
        with session_scope(self.settings.database_url) as session:
            live = session.scalars(
                select(Run).where(Run.status.in_(_LIVE)).options(lazyload(Run.steps))
            ).all()
            for run in live:
                counts[(run.status, derive(self.settings, run, now).value)] += 1
            terminal = session.execute(
                select(Run.status, func.count())
                .where(Run.status.in_(_TERMINAL))
                .group_by(Run.status)
            ).all()
            for status, count in terminal:
                counts[(status, Health.ENDED.value)] = count
            past = session.scalar(
                select(func.count())
                .select_from(Run)
                .where(Run.status.in_(_LIVE), Run.deadline_at < now)
            )
            stops = session.execute(
                select(RunEvent.to_status, RunEvent.stop_reason, func.count())
                .where(RunEvent.step_id.is_(None), RunEvent.stop_reason.is_not(None))
                .group_by(RunEvent.to_status, RunEvent.stop_reason)
            ).all()
            latency = self._cancel_latency(session)
        for (status, health), count in sorted(counts.items()):
            runs.add_metric([status, health], count)
        yield runs

        transitions = CounterMetricFamily(
            "orchestration_run_terminal_transitions",
            "Runs that reached a terminal status, by status and stop_reason (run_events).",
            labels=["status", "stop_reason"],
        )
        by_reason = {
            (status.value, reason.value): 0
            for status, reasons in STOP_REASONS.items()
            for reason in reasons
        }
        by_reason.update({(status, str(reason)): count for status, reason, count in stops})
        for (status, reason), count in sorted(by_reason.items()):
            transitions.add_metric([status, reason], count)
        yield transitions

        yield latency

        deadline = GaugeMetricFamily(
            "orchestration_runs_past_deadline",
            "Live runs whose deadline_at has passed; the sweeper keeps this at 0.",
        )
        deadline.add_metric([], past or 0)
        yield deadline

        sweeper = GaugeMetricFamily(
            "orchestration_sweeper_last_pass_age_seconds",
            "Seconds since the sweeper's last pass (+Inf if it never ran).",
        )
        age = sweeper_age(self.settings, now)
        sweeper.add_metric([], float("inf") if age is None else age)
        yield sweeper

    def _cancel_latency(self, session: Session) -> HistogramMetricFamily:
        seconds = _seconds(session, Run.cancel_requested_at, Run.finished_at)
        row = session.execute(
            select(
                func.count(),
                func.coalesce(func.sum(seconds), 0.0),
                *(
                    func.coalesce(func.sum(case((seconds <= le, 1), else_=0)), 0)
                    for le in CANCEL_BUCKETS
                ),
            ).where(
                Run.status == RunStatus.CANCELLED.value,
                Run.cancel_requested_at.is_not(None),
                Run.finished_at.is_not(None),
            )
        ).one()
        total, total_seconds, *cumulative = row
        buckets = [
            (str(float(le)), float(count))
            for le, count in zip(CANCEL_BUCKETS, cumulative, strict=True)
        ]
        buckets.append(("+Inf", float(total)))
        return HistogramMetricFamily(
            "orchestration_cancel_to_terminal_seconds",
            "From cancel_requested_at to finished_at, over cancelled runs.",
            buckets=buckets,
            sum_value=float(total_seconds),
        )


class _Default(Collector):
    """The process's default registry (provider call metrics, process metrics)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def registry(settings: Settings, clock: Callable[[], datetime] = utcnow) -> CollectorRegistry:
    """What ``/metrics`` serves: :class:`RunMetrics` and the provider call metrics.

    With ``PROMETHEUS_MULTIPROC_DIR`` set (workers and the API pointed at one directory), the
    provider metrics of every process are aggregated from there instead of this process's
    default registry, as ``prometheus_client`` requires.
    """
    collected = CollectorRegistry()
    collected.register(RunMetrics(settings, clock))
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(collected)  # type: ignore[no-untyped-call]
    else:
        collected.register(_Default())
    return collected
