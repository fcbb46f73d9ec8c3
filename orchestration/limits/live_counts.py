"""The live runs of each owner and of all owners, counted by the database as they change.

A launch is admitted only while the live runs, in all and of its owner, are under
``ORCH_MAX_ACTIVE_RUNS`` and ``ORCH_MAX_ACTIVE_RUNS_PER_OWNER`` (:mod:`.admission`). Counting
the live rows at each launch would cost what there is to count; here the counts are rows that
triggers on ``runs`` keep (migration 0014), so a launch reads a fixed number of them. Every
writer of a status, now or later, keeps them right without knowing of them. On PostgreSQL
each count has up to :data:`SLOTS` rows, one per connection slot, so that concurrent
transactions add to different rows (``docs/architecture.md`` says why they never deadlock);
the counts are read in the statement's snapshot: the limits are admission control, not a
lock. Branch runs are counted like every run (migration 0017): a branching step admits its
branch runs only when its owner's budget has room for all of them
(``execution.branching``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from orchestration.core.db import constant
from orchestration.core.models import LiveRunCount

#: The owner of the rows that count every owner's live runs (no owner is empty: launch
#: refuses one, ``launching.check_name``).
TOTAL = ""
#: Rows per count on PostgreSQL (see the module docstring).
SLOTS = 16


def count_of(owner: Any) -> Any:
    """The live runs of ``owner`` (a value or a bound parameter; :data:`TOTAL` for all), as
    a scalar subquery: at most :data:`SLOTS` rows read through the primary key."""
    return (
        select(func.coalesce(func.sum(LiveRunCount.live), constant(0)))
        .where(LiveRunCount.owner == owner)
        .scalar_subquery()
    )
