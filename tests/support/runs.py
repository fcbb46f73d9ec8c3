"""Waiting for runs to end, and checking they ended by the deadline they stated."""

from __future__ import annotations

import time

import pytest

from orchestration.reads.records import RunRecord
from orchestration.service import Orchestrator, is_terminal
from tests.conftest import wait_for

#: Clock and scheduling slack allowed between the test process and the stack (seconds).
DEADLINE_MARGIN = 2.0


def finished(orch: Orchestrator, run_id: str, owner: str, timeout: float = 30) -> RunRecord:
    """The run's record once it is terminal; fail after ``timeout`` seconds."""
    record: RunRecord = wait_for(
        lambda: (r := orch.get(run_id, owner=owner)) and is_terminal(r) and r,
        timeout,
        interval=0.1,
        what=f"run {run_id} terminal",
    )
    return record


def terminal_within_deadline(
    orch: Orchestrator,
    run_id: str,
    owner: str,
    timeout: float,
    *,
    live: RunRecord | None = None,
) -> tuple[RunRecord, list[tuple[str, str | None]]]:
    """Poll until terminal; the run must end by the last ``deadline_at`` it showed while live.

    ``live`` is a live record the caller already holds (the run may end before the first poll
    here). Returns the terminal record and the (status, park_reason) pairs seen on the way.
    """
    seen: list[tuple[str, str | None]] = []
    if live is not None:
        seen.append((live.status, live.park_reason))
    last_live: RunRecord | None = live
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        record = orch.get(run_id, owner=owner)
        if (record.status, record.park_reason) not in seen:
            seen.append((record.status, record.park_reason))
        if is_terminal(record):
            assert last_live is not None and last_live.deadline_at is not None
            assert record.finished_at is not None
            late = (record.finished_at - last_live.deadline_at).total_seconds()
            assert late <= DEADLINE_MARGIN, (
                f"ended {late:.1f}s after deadline_at {last_live.deadline_at} "
                f"(last live: {last_live.status}/{last_live.park_reason}); seen {seen}"
            )
            return record, seen
        last_live = record
        time.sleep(0.1)
    pytest.fail(f"run {run_id} not terminal within {timeout}s; seen {seen}")
