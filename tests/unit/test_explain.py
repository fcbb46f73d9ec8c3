"""``explain``'s next move is true at the time it is read: a poll due in the past is overdue
and waits for a worker (issue 15: after an answer with no worker up, it named a past time as
"the next poll")."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestration.core.health import Judged
from orchestration.core.settings import Settings
from orchestration.core.states import Health
from orchestration.reads.explain import explain
from orchestration.reads.records import RunRecord, StepRecord
from orchestration.service import Orchestrator
from tests.unit.support import (
    T0,
    RecordingDispatcher,
    launch,
    make_settings,
    s,
    step_spec,
    workflow,
)


def _record(next_poll_at: datetime | None, now: datetime) -> RunRecord:
    step: dict[str, Any] = {
        "step_id": "a",
        "index": 0,
        "provider": "scripted",
        "status": "running",
        "attempt": 1,
        "idempotency_key": "r:a:1",
        "provider_run_id": "p",
        "input": "go",
        "output": None,
        "error": None,
        "polls": 3,
        "last_provider_status": "running",
        "prompt": None,
        "celery_task_id": "t",
        "worker": None,
        "worker_pid": None,
        "created_at": T0,
        "started_at": T0,
        "finished_at": None,
        "next_poll_at": next_poll_at,
    }
    return RunRecord(
        id="r",
        owner="o",
        request_id="q",
        fingerprint="f",
        workflow_name="w",
        workflow={},
        args={},
        status="running",
        health="working",
        stop_reason=None,
        error=None,
        result=None,
        created_at=T0,
        started_at=T0,
        finished_at=None,
        heartbeat_at=now,
        cancel_requested_at=None,
        deadline_at=now + s(60),
        task_ids=["t"],
        current_step=0,
        rearms=0,
        park_reason=None,
        parked_since=None,
        waiting_until=None,
        concurrency_key=None,
        on_conflict=None,
        concurrency=None,
        needs_review=False,
        steps=[StepRecord(**step)],
    )


#: What the SQL judges of the working run of :func:`_record`.
WORKING = Judged(Health.WORKING, heartbeat_dead=False, park_expired=False, approval_expired=False)


@pytest.fixture
def bounds(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, queue="steps")


def test_a_poll_due_later_is_the_next_poll(bounds: Settings) -> None:
    now = T0 + s(10)
    summary = explain(bounds, _record(now + s(5), now), WORKING, now)
    assert summary["next"] == f"the next poll at {(now + s(5)).isoformat(timespec='seconds')}"


def test_a_poll_overdue_says_so_and_that_it_waits_for_a_worker(bounds: Settings) -> None:
    now = T0 + s(40)
    due = T0 + s(10)
    summary = explain(bounds, _record(due, now), WORKING, now)
    assert summary["next"] == (
        f"the next poll, overdue since {due.isoformat(timespec='seconds')} (30s ago): "
        "it waits for a worker consuming queue 'steps'"
    )


def test_a_poll_due_just_now_is_not_called_overdue(bounds: Settings) -> None:
    now = T0 + s(10)
    assert "overdue" not in explain(bounds, _record(now - s(1), now), WORKING, now)["next"]


def test_the_record_and_the_judgement_are_read_at_one_instant(settings: Settings) -> None:
    """A heartbeat that dies between two reads of the clock: explain reads the run's health
    and the sweeper's judgement at the same ``now``, never stalled with no rule owning it."""
    run_id = launch(settings, workflow(step_spec()), now=T0)
    alive = T0 + timedelta(seconds=settings.heartbeat_timeout / 2)
    dead = T0 + timedelta(seconds=settings.heartbeat_timeout * 3)
    clocks = iter([alive, dead, dead, dead])
    orch = Orchestrator(settings, RecordingDispatcher(), clock=lambda: next(clocks))
    said = orch.explain(run_id, owner="owner-1")
    assert said["health"] == Health.WORKING.value, said
    assert "leaves it alone" not in said["next"], said
