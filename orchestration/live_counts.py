"""The live runs of each owner and of all owners, counted by the database as they change.

A launch is admitted only while the live runs, in all and of its owner, are under
``ORCH_MAX_ACTIVE_RUNS`` and ``ORCH_MAX_ACTIVE_RUNS_PER_OWNER``. Counting them at each launch
cost what there was to count: on PostgreSQL the launch statement took 2.3 ms with about 600
live runs and 7.1 ms with about 2,600 (1.8 ms without the counts), so a busy deployment paid
most for its launches just as it neared its limits. Here the counts are kept as rows, and a
launch reads a fixed number of them whatever the number of live runs.

The rows are written by triggers on ``runs`` (migration 0014), never by the engine: a run
that is inserted live adds one, a run that leaves the live statuses (terminal is final, so it
never comes back) or is deleted while live takes one away, and every writer of a status, now
or later, keeps them right without knowing of them. Branch runs are bounded by their step
(``ORCH_MAX_BRANCHES``) and are not counted, as they never were.

On PostgreSQL each owner and the total (:data:`TOTAL`) have up to :data:`SLOTS` rows, one per
``pg_backend_pid() % SLOTS``, so that concurrent transactions on other connections add to
other rows; a count is the sum of its rows. The triggers are deferred to the commit, and each
adds to the total's row before the owner's: a transaction takes a count row's lock only once
all its other locks are taken, and always its slot's total row first, so two transactions
can wait on each other's count rows only in one order, and never deadlock on them. SQLite
writes one transaction at a time: there every count is one row (slot 0).

The counts are read in the statement's snapshot, as the count of rows was: the limits are
admission control, not a lock.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, SmallInteger, String, func, select
from sqlalchemy.orm import Mapped, mapped_column

from orchestration.models import Base

#: The owner of the rows that count every owner's live runs (no owner is empty: launch
#: refuses one, ``launching.check_name``).
TOTAL = ""
#: Rows per count on PostgreSQL (see the module docstring).
SLOTS = 16


class LiveRunCount(Base):
    """A part of ``owner``'s count of live top-level runs (of all owners', for
    :data:`TOTAL`): the count is the sum of its slots."""

    __tablename__ = "live_run_counts"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)
    slot: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    live: Mapped[int] = mapped_column(Integer)


def count_of(owner: Any) -> Any:
    """The live runs of ``owner`` (a value or a bound parameter; :data:`TOTAL` for all), as
    a scalar subquery: at most :data:`SLOTS` rows read through the primary key."""
    return (
        select(func.coalesce(func.sum(LiveRunCount.live), 0))
        .where(LiveRunCount.owner == owner)
        .scalar_subquery()
    )
