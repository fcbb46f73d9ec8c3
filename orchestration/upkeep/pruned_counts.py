"""What a prune leaves of the runs it deletes: their counts, so that totals never go down.

``/metrics`` reports terminal runs by status and stop reason, and the cancel-to-terminal
histogram, as counters read from the rows. A prune deletes rows, and a counter that drops
reads to Prometheus as a restart (``rate()`` over it turns into a spike). So each prune batch
adds the runs it deleted to ``pruned_runs``, in its own transaction, keyed by the hour they
finished in, their status, stop reason and cancel-latency bucket; ``/metrics`` adds these rows
to the runs it still finds. Counting from the ``DELETE … RETURNING`` rows counts each run
once even when two prunes pick the same batch (the second deletes nothing).

The hour in the key lets a reader split the totals at an hour boundary exactly as it splits
the runs by ``finished_at`` (see ``surfaces/api/metrics.py``: settled totals are read once).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestration.core.models import PrunedRuns
from orchestration.core.states import RunStatus

#: Buckets of the cancel-to-terminal histogram (seconds): a hard cancel lands in well under a
#: second; a graceful one may take up to ``ORCH_CANCEL_GRACE`` plus a sweep.
CANCEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: The bucket of a run without a cancel latency (not cancelled, or no request recorded).
NO_LATENCY = -1


def hour_of(when: datetime) -> datetime:
    return when.replace(minute=0, second=0, microsecond=0)


def bucket_of(seconds: float) -> int:
    """The index of the first bucket ``seconds`` fits in (``len(CANCEL_BUCKETS)``: +Inf)."""
    return bisect.bisect_left(CANCEL_BUCKETS, seconds)


def keep(
    session: Session,
    deleted: Iterable[Sequence[object]],
) -> int:
    """Add the deleted runs ``(status, stop_reason, finished_at, cancel_requested_at)`` to
    the totals, in the caller's transaction; how many runs."""
    counts: Counter[tuple[datetime, str, str, int]] = Counter()
    seconds: dict[tuple[datetime, str, str, int], float] = {}
    for status, reason, finished_at, requested_at in deleted:
        assert isinstance(finished_at, datetime)
        latency = None
        if status == RunStatus.CANCELLED.value and isinstance(requested_at, datetime):
            latency = (finished_at - requested_at).total_seconds()
        key = (
            hour_of(finished_at),
            str(status),
            str(reason or ""),
            NO_LATENCY if latency is None else bucket_of(latency),
        )
        counts[key] += 1
        seconds[key] = seconds.get(key, 0.0) + (latency or 0.0)
    for key, count in sorted(counts.items()):
        _add(session, key, count, seconds[key])
    return sum(counts.values())


def _add(session: Session, key: tuple[datetime, str, str, int], count: int, total: float) -> None:
    hour, status, reason, bucket = key
    ident = {"hour": hour, "status": status, "stop_reason": reason, "bucket": bucket}
    row = session.get(PrunedRuns, ident, with_for_update=True)
    if row is None:
        try:
            with session.begin_nested():  # a concurrent prune may insert the same key
                session.add(PrunedRuns(**ident, count=count, latency_seconds=total))
            return
        except IntegrityError:
            row = session.get(PrunedRuns, ident, with_for_update=True, populate_existing=True)
            assert row is not None
    row.count += count
    row.latency_seconds += total
