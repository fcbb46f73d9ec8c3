"""The fleet's recent history: poll lateness and sweep time, a row per source and period.

The fleet page plots the last hour, but the figures are born in many processes (each worker
child times the polls it runs, each beat its passes), so each source writes what it saw as a
:class:`Summary` (count, sum, largest and counts per bucket): a worker process one row per
minute in which it polled, the sweeper one row per pass. Summaries add up, so a minute's
quantile across the fleet comes from the summed buckets, the same way Prometheus histograms
add. Rows older than :data:`KEEP` go at every sweep pass (through ``ix_fleet_samples_at``),
so the table holds a couple of hours whatever the fleet's age.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from orchestration.core.models import FleetSample

#: Upper bounds (seconds) of the buckets; a last, unbounded bucket holds the rest.
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: How long rows are kept: the page's hour and a margin for a late flush.
KEEP = timedelta(hours=2)


class Series(StrEnum):
    """What a row measures, in seconds."""

    #: How long after its countdown's ETA a poll began (the broker and the pool's delay).
    POLL_LATENESS = "poll_lateness"
    #: How long one sweeper pass took.
    SWEEP_SECONDS = "sweep_seconds"


@dataclass
class Summary:
    """Values of one series, kept as a histogram: cheap to add to, and adds up exactly."""

    count: int = 0
    total: float = 0.0
    largest: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))

    def add(self, value: float) -> None:
        """Count one value (a negative one, from clocks a little apart, counts as 0)."""
        value = max(0.0, value)
        self.count += 1
        self.total += value
        self.largest = max(self.largest, value)
        self.buckets[bisect.bisect_left(BUCKETS, value)] += 1

    def merge(self, other: Summary) -> None:
        self.count += other.count
        self.total += other.total
        self.largest = max(self.largest, other.largest)
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding the ``q`` quantile, never above the largest
        value seen (so a quiet minute does not read as its bucket's bound)."""
        rank = q * self.count
        seen = 0
        for index, count in enumerate(self.buckets):
            seen += count
            if count and seen >= rank:
                bound = BUCKETS[index] if index < len(BUCKETS) else self.largest
                return min(bound, self.largest)
        return self.largest

    @classmethod
    def of(cls, values: Iterable[float]) -> Summary:
        summary = cls()
        for value in values:
            summary.add(value)
        return summary


def minute_of(when: datetime) -> datetime:
    return when.replace(second=0, microsecond=0)


def record(session: Session, series: Series, source: str, at: datetime, seen: Summary) -> None:
    """Add what ``source`` saw of ``series`` in the period starting ``at``."""
    if seen.count:
        session.add(
            FleetSample(
                series=series.value,
                source=source[:200],
                at=at,
                count=seen.count,
                total=seen.total,
                largest=seen.largest,
                buckets=list(seen.buckets),
            )
        )


def per_minute(
    session: Session, series: Series, start: datetime, minutes: int
) -> list[Summary | None]:
    """The fleet's summary of ``series`` in each minute from ``start``, oldest first; ``None``
    for a minute nothing reported."""
    found: list[Summary | None] = [None] * minutes
    rows = session.execute(
        select(
            FleetSample.at,
            FleetSample.count,
            FleetSample.total,
            FleetSample.largest,
            FleetSample.buckets,
        ).where(
            FleetSample.series == series.value,
            FleetSample.at >= start,
            FleetSample.at < start + timedelta(minutes=minutes),
        )
    )
    for at, count, total, largest, buckets in rows:
        slot = int((at - start).total_seconds() // 60)
        summary = found[slot] = found[slot] or Summary()
        summary.merge(Summary(count, total, largest, list(buckets)))
    return found


def forget(session: Session, now: datetime) -> int:
    """Delete the rows older than :data:`KEEP`; how many."""
    result = session.execute(delete(FleetSample).where(FleetSample.at < now - KEEP))
    return int(getattr(result, "rowcount", 0) or 0)
