"""``bench.schedules`` (issue 30's closing figures) works: a tiny pass run on SQLite seeds
schedules across owners, and a pass with every one due takes each owner's share. The
10,000-schedule run on PostgreSQL is ``python -m bench.schedules``."""

from __future__ import annotations

from bench import schedules


def test_a_tiny_pass_run_fires_each_owners_share() -> None:
    row = schedules.measure_pass("sqlite://", 80, 4, 1)
    assert (row["schedules"], row["owners"]) == (80, 4)
    # Twenty due an owner, ten fired an owner (ORCH_SCHEDULE_FIRES_PER_OWNER): the rest waits.
    assert (row["full_pass_fired"], row["full_pass_left_first"]) == (40, 40)
