"""Poll lateness, as each worker process sees it: how long after its countdown's ETA a poll
began. It is the delay that the broker, the prefetch and a busy pool add to every poll, and
the figure that says the fleet is too small before any deadline does.

Each process counts its polls in a Prometheus histogram (``/metrics`` of that process) and
in a :class:`~orchestration.upkeep.fleet_series.Summary` per minute, written as one row when the
minute has passed (at the process's first poll after it, or when the process exits): one
short transaction per process per minute, outside the step's own.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import datetime

from prometheus_client import Histogram
from sqlalchemy.orm import Session

from orchestration.core.followups import Done, Transact
from orchestration.upkeep import fleet_series

LOG = logging.getLogger(__name__)

POLL_LATENESS_SECONDS = Histogram(
    "orchestration_poll_lateness_seconds",
    "How long after its countdown's ETA a poll began.",
    buckets=fleet_series.BUCKETS,
)


def lateness(eta: object, now: datetime) -> float | None:
    """Seconds from the message's ETA (Celery's ISO 8601 header) to ``now``; ``None`` for a
    message without one (a chain's first delivery is not a poll)."""
    if isinstance(eta, str):
        try:
            eta = datetime.fromisoformat(eta)
        except ValueError:
            return None
    if not isinstance(eta, datetime) or eta.tzinfo is None:
        return None
    return (now - eta).total_seconds()


class MinuteRecorder:
    """This process's polls of the current minute, written once the minute is over."""

    def __init__(self, transact: Transact, source: str | None = None) -> None:
        self.transact = transact
        self.source = source or f"{socket.gethostname()}:{os.getpid()}"
        self.minute: datetime | None = None
        self.seen = fleet_series.Summary()
        self._lock = threading.Lock()

    def observe(self, seconds: float, now: datetime) -> None:
        """Count one poll's lateness; write the previous minute first if ``now`` is past it."""
        POLL_LATENESS_SECONDS.observe(max(0.0, seconds))
        minute = fleet_series.minute_of(now)
        with self._lock:
            over = self._take() if self.minute not in (None, minute) else None
            self.minute = minute
            self.seen.add(seconds)
        if over is not None:
            self._write(*over)

    def flush(self) -> None:
        """Write what is counted (the process is exiting)."""
        with self._lock:
            taken = self._take()
        self._write(*taken)

    def _take(self) -> tuple[datetime | None, fleet_series.Summary]:
        """What is counted, leaving nothing: written outside the lock, so a thread pool's
        other polls do not wait for the transaction."""
        taken = (self.minute, self.seen)
        self.minute, self.seen = None, fleet_series.Summary()
        return taken

    def _write(self, minute: datetime | None, seen: fleet_series.Summary) -> None:
        if minute is None or not seen.count:
            return

        def write(session: Session) -> Done[None]:
            fleet_series.record(
                session, fleet_series.Series.POLL_LATENESS, self.source, minute, seen
            )
            return Done(None)

        try:
            self.transact(write)
        except Exception:  # a figure for a plot must never fail a step
            LOG.warning("poll lateness of %s not recorded", minute.isoformat(), exc_info=True)
