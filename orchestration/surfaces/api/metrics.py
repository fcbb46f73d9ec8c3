"""Prometheus metrics computed from the database at scrape time, plus the process's own.

The database is the truth about runs, so these are read from it, not counted in a process
that may restart. ``/metrics`` is unauthenticated and may be scraped by anyone every few
seconds, so a scrape never reads a run's payloads or the event journal, and its cost does
not grow with history (issue 10). Three column-only statements on ``runs``, each through an
index:

* terminal runs by status and stop reason, from ``ix_runs_finished``. A terminal status is
  final and is written with its stop reason by the one transition that enters it, so this
  *is* the count of terminal transitions in ``run_events``, without reading the journal.
  Runs that finished before the hour that began :data:`SETTLE` ago can no longer change, so
  their totals are read once per process and kept; a scrape reads only the runs finished
  since. The runs a prune deleted are in ``run_totals.PrunedRuns``, keyed by the hour they
  finished in, and each statement adds them with a ``UNION ALL`` (one statement: one
  snapshot, so a prune committing between two reads cannot count a run twice or not at all);
* the cancel-to-terminal histogram over cancelled runs (``ix_runs_cancel_latency``), kept
  and completed the same way;
* live runs by status, health (:func:`~orchestration.core.health.expression`, in SQL)
  and past ``deadline_at``: one ``GROUP BY`` over the live rows only (``ix_runs_live``);

plus the sweeper's age (its one-row table), and the budgets' use of the
``ORCH_METRICS_TOP_OWNERS`` owners with the most live runs (read from the live-run counts'
rows, then a statement per owner over its own rows): owner names are labels only for those.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import accumulate
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
from sqlalchemy import ColumnElement, case, func, select, true, union_all
from sqlalchemy.engine import make_url

from orchestration.core import health as judgement
from orchestration.core.db import session_scope, utcnow
from orchestration.core.models import PrunedRuns, Run
from orchestration.core.settings import Settings
from orchestration.core.states import RUN_LIVE, RUN_TERMINAL, STOP_REASONS, Health, RunStatus
from orchestration.limits import owner_budgets
from orchestration.reads import summaries
from orchestration.runtime.liveness import sweeper_age
from orchestration.upkeep.pruned_counts import CANCEL_BUCKETS, NO_LATENCY, hour_of

LOG = logging.getLogger(__name__)

#: Terminal runs are final: once a run has been terminal this long, its status, stop reason
#: and cancel latency can no longer change or still be uncommitted, so its share of the
#: totals is read once (see :class:`RunMetrics`). Far above the longest a writer holds a
#: transition uncommitted (``lock_release_seconds``) plus the clock skew between hosts.
SETTLE = timedelta(hours=1)

_LIVE = sorted(s.value for s in RUN_LIVE)
_TERMINAL = sorted(s.value for s in RUN_TERMINAL)


def _latency(database_url: str) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    """The bucket index of a cancelled run's ``finished_at - cancel_requested_at``, and the sum
    of those latencies in seconds, in SQL.

    On PostgreSQL the buckets compare intervals: ``EXTRACT(epoch …)`` is ``numeric`` there,
    and a dozen numeric comparisons per row made this the dearest statement of a scrape.
    """
    start, end = Run.cancel_requested_at, Run.finished_at
    if make_url(database_url).get_backend_name() == "postgresql":
        latency: ColumnElement[Any] = end - start
        limits: list[Any] = [timedelta(seconds=le) for le in CANCEL_BUCKETS]
        total: ColumnElement[Any] = func.extract("epoch", func.sum(latency))
    else:
        latency = (func.julianday(end) - func.julianday(start)) * 86400.0
        limits = list(CANCEL_BUCKETS)
        total = func.sum(latency)
    bucket = case(
        *((latency <= limit, index) for index, limit in enumerate(limits)),
        else_=len(limits),
    )
    return bucket, total


@dataclass
class _Settled:
    """Totals over the terminal runs that finished before ``until`` (see :data:`SETTLE`)."""

    until: datetime | None = None
    #: Terminal runs by (status, stop_reason).
    ended: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Cancelled runs per latency bucket (not cumulative), and their summed latency.
    latency: list[int] = field(default_factory=lambda: [0] * (len(CANCEL_BUCKETS) + 1))
    latency_seconds: float = 0.0


class RunMetrics(Collector):
    """A collector that reads the runs table at each scrape.

    Terminal runs are final, so the totals over the settled ones (finished more than
    :data:`SETTLE` ago) are read once and kept; each scrape reads only the runs that finished
    since the last one settled, plus the live runs.
    """

    def __init__(self, settings: Settings, clock: Callable[[], datetime] = utcnow) -> None:
        self.settings = settings
        self.clock = clock
        self._settled = _Settled()
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "orchestration_metrics_database_up",
            "1 if the last scrape could read the database, else 0.",
        )
        try:
            with self._lock:
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
        before = self._settled
        # On an hour boundary, where the pruned totals can be split the same way.
        cutoff = max(hour_of(now - SETTLE), before.until or hour_of(now - SETTLE))
        # Rows finished before ``before.until`` are in its totals already.
        unread = (
            Run.finished_at.is_not(None)
            if before.until is None
            else Run.finished_at >= before.until
        )
        unread_pruned = true() if before.until is None else PrunedRuns.hour >= before.until
        settles = Run.finished_at < cutoff
        pruned_settles = PrunedRuns.hour < cutoff
        bucket, total = _latency(self.settings.database_url)
        with session_scope(self.settings.database_url) as session:
            finished: Sequence[Any] = session.execute(
                union_all(
                    select(Run.status, Run.stop_reason, settles, func.count())
                    .where(summaries.terminal(), unread)
                    .group_by(Run.status, Run.stop_reason, settles),
                    select(
                        PrunedRuns.status,
                        PrunedRuns.stop_reason,
                        pruned_settles,
                        func.sum(PrunedRuns.count),
                    )
                    .where(unread_pruned)
                    .group_by(PrunedRuns.status, PrunedRuns.stop_reason, pruned_settles),
                )
            ).all()
            cancelled: Sequence[Any] = session.execute(
                union_all(
                    select(bucket, settles, func.count(), total)
                    .where(
                        summaries.status_in([RunStatus.CANCELLED.value]),
                        Run.cancel_requested_at.is_not(None),
                        unread,
                    )
                    .group_by(bucket, settles),
                    select(
                        PrunedRuns.bucket,
                        pruned_settles,
                        func.sum(PrunedRuns.count),
                        func.sum(PrunedRuns.latency_seconds),
                    )
                    .where(unread_pruned, PrunedRuns.bucket != NO_LATENCY)
                    .group_by(PrunedRuns.bucket, pruned_settles),
                )
            ).all()
            health = judgement.expression()
            live = [
                (str(status), str(state), int(count), int(past))
                for status, state, count, past in session.execute(
                    select(
                        Run.status,
                        health,
                        func.count(),
                        func.coalesce(func.sum(case((Run.deadline_at < now, 1), else_=0)), 0),
                    )
                    .where(summaries.live())
                    .group_by(Run.status, health),
                    judgement.params(self.settings, now),
                )
            ]
            owners = owner_budgets.busiest(session, self.settings, self.settings.metrics_top_owners)
        settled = _Settled(cutoff, Counter(before.ended), list(before.latency))
        settled.latency_seconds = before.latency_seconds
        ended = Counter(before.ended)
        for status, reason, settling, count in finished:
            ended[(status, str(reason))] += count
            if settling:
                settled.ended[(status, str(reason))] += count
        latency = list(before.latency)
        latency_seconds = before.latency_seconds
        for index, settling, count, seconds in cancelled:
            latency[int(index)] += count
            latency_seconds += float(seconds or 0.0)
            if settling:
                settled.latency[int(index)] += count
                settled.latency_seconds += float(seconds or 0.0)
        self._settled = settled

        yield self._runs(ended, live)
        yield self._transitions(ended)
        yield self._histogram(latency, latency_seconds)

        deadline = GaugeMetricFamily(
            "orchestration_runs_past_deadline",
            "Live runs whose deadline_at has passed; the sweeper keeps this at 0.",
        )
        deadline.add_metric([], sum(past for *_, past in live))
        yield deadline

        yield from self._owners(owners)

        sweeper = GaugeMetricFamily(
            "orchestration_sweeper_last_pass_age_seconds",
            "Seconds since the sweeper's last pass (+Inf if it never ran).",
        )
        age = sweeper_age(self.settings, now)
        sweeper.add_metric([], float("inf") if age is None else age)
        yield sweeper

    @staticmethod
    def _owners(owners: list[tuple[str, list[owner_budgets.Use]]]) -> Iterator[Metric]:
        """Each budget's use and limit for the busiest owners (``ORCH_METRICS_TOP_OWNERS``):
        at most that many owners times the budgets as label sets."""
        used = GaugeMetricFamily(
            "orchestration_owner_budget_used",
            "What an owner uses of each budget, for the owners with the most live runs.",
            labels=["owner", "budget"],
        )
        limit = GaugeMetricFamily(
            "orchestration_owner_budget_limit",
            "Each budget's limit for those owners (the setting, or the owner's own value).",
            labels=["owner", "budget"],
        )
        for owner, uses in owners:
            for one in uses:
                used.add_metric([owner, one.budget], one.used)
                limit.add_metric([owner, one.budget], one.limit)
        yield used
        yield limit

    @staticmethod
    def _runs(
        ended: Counter[tuple[str, str]], live: list[tuple[str, str, int, int]]
    ) -> GaugeMetricFamily:
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
        for (status, _), count in ended.items():
            counts[(status, Health.ENDED.value)] += count
        for status, health, count, _ in live:
            counts[(status, health)] = count
        for (status, health), count in sorted(counts.items()):
            runs.add_metric([status, health], count)
        return runs

    @staticmethod
    def _transitions(ended: Counter[tuple[str, str]]) -> CounterMetricFamily:
        transitions = CounterMetricFamily(
            "orchestration_run_terminal_transitions",
            "Runs that reached a terminal status, by status and stop_reason.",
            labels=["status", "stop_reason"],
        )
        by_reason = {
            (status.value, reason.value): 0
            for status, reasons in STOP_REASONS.items()
            for reason in reasons
        }
        by_reason.update(ended)
        for (status, reason), count in sorted(by_reason.items()):
            transitions.add_metric([status, reason], count)
        return transitions

    @staticmethod
    def _histogram(per_bucket: list[int], total_seconds: float) -> HistogramMetricFamily:
        cumulative = list(accumulate(per_bucket))
        buckets = [
            (str(float(le)), float(count))
            for le, count in zip(CANCEL_BUCKETS, cumulative, strict=False)
        ]
        buckets.append(("+Inf", float(cumulative[-1])))
        return HistogramMetricFamily(
            "orchestration_cancel_to_terminal_seconds",
            "From cancel_requested_at to finished_at, over cancelled runs.",
            buckets=buckets,
            sum_value=total_seconds,
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
