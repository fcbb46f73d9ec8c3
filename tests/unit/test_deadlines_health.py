"""``deadline_at`` and health, with the clock as a parameter: deadlines in Python, health as the
SQL judges a run's row (``orchestration.core.health``, the one place it is written)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import delete, insert

from orchestration.core import deadlines, health
from orchestration.core.db import session_scope
from orchestration.core.models import Run
from orchestration.core.settings import Settings
from orchestration.core.states import (
    RUN_LIVE,
    RUN_TERMINAL,
    UNATTENDED_PARKS,
    Health,
    ParkReason,
    RunStatus,
)
from orchestration.reads.explain import explain
from orchestration.reads.records import to_record
from tests.unit.support import PROPERTY, T0, make_settings, s, unguarded


@pytest.fixture
def bounds(settings: Settings) -> Settings:
    """heartbeat 8 s, sweep 1 s, provider 3 s (slack 8 s), grace 2 s; budgets human 100, engine 50,
    platform 30, default 40; on a migrated database, where health is judged."""
    return settings


_FILLED = {
    "owner": "o",
    "request_id": "q",
    "fingerprint": "f",
    "workflow_name": "w",
    "workflow": {},
    "args": {},
    "task_ids": [],
    "current_step": 0,
    "needs_review": False,
    "updated_at": T0,
    "cause": "a test's row",
}


def _judge(settings: Settings, run: Run, now: datetime) -> health.Judged:
    """What the SQL judges of ``run``'s columns at ``now`` (the row is written, then gone)."""
    columns = {column.key: getattr(run, column.key) for column in Run.__table__.columns}
    row = {**columns, **{k: v for k, v in _FILLED.items() if columns.get(k) is None}}
    with unguarded(settings) as session:
        session.execute(delete(Run).where(Run.id == row["id"]))
        session.execute(insert(Run).values(row))
    with session_scope(settings.database_url) as session:
        judged = health.judge(session, settings, row["id"], now)
    assert judged is not None
    return judged


def _health(settings: Settings, run: Run, now: datetime) -> Health:
    return _judge(settings, run, now).health


def slack(settings: Settings) -> float:
    return deadlines.slack_seconds(settings)


def _run(status: RunStatus, **values: object) -> Run:
    fields: dict[str, object] = {
        "id": "r",
        "status": status.value,
        "created_at": T0,
        "heartbeat_at": T0,
        "rearms": 0,
        "concurrency": None,
        "park_reason": None,
        "parked_since": None,
        "waiting_until": None,
        **values,
    }
    return Run(**fields)


# -- deadlines.compute ---------------------------------------------------------------------


@pytest.mark.parametrize("status", [RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING])
def test_a_moving_run_is_due_one_heartbeat_and_one_sweep_after_its_stamp(
    bounds: Settings, status: RunStatus
) -> None:
    due = deadlines.compute(bounds, status, heartbeat_at=T0)
    assert due == T0 + s(bounds.heartbeat_timeout + slack(bounds))


def test_a_running_run_is_due_by_its_dead_heartbeat_whatever_its_step_timeout(
    bounds: Settings,
) -> None:
    # Chaos finding (tolerance 0): a deadline counted from the step's timeout was one the
    # sweeper could not keep once the worker died. The step times itself out while its worker
    # lives; otherwise the sweeper's condition is the dead heartbeat, one heartbeat later.
    due = deadlines.compute(bounds, RunStatus.RUNNING, heartbeat_at=T0)
    assert due == T0 + s(bounds.heartbeat_timeout + slack(bounds))
    assert due >= deadlines.heartbeat_expiry(bounds, T0) + s(bounds.sweep_interval)


def test_a_cancelling_run_is_due_after_both_the_grace_and_the_heartbeat(
    bounds: Settings,
) -> None:
    # The sweeper enforces a cancel only once the grace is over AND the heartbeat is dead.
    early = deadlines.compute(bounds, RunStatus.CANCELLING, heartbeat_at=T0, cancel_requested_at=T0)
    assert early == T0 + s(max(bounds.cancel_grace, bounds.heartbeat_timeout) + slack(bounds))
    late_request = deadlines.compute(
        bounds, RunStatus.CANCELLING, heartbeat_at=T0, cancel_requested_at=T0 + s(20)
    )
    assert late_request == T0 + s(20 + bounds.cancel_grace + slack(bounds))


def test_a_cancelling_run_without_a_request_time_falls_back_to_the_heartbeat(
    bounds: Settings,
) -> None:
    due = deadlines.compute(bounds, RunStatus.CANCELLING, heartbeat_at=T0)
    assert due == T0 + s(bounds.heartbeat_timeout + slack(bounds))


def test_a_human_park_is_due_at_its_budget_whatever_the_heartbeat(bounds: Settings) -> None:
    due = deadlines.compute(
        bounds,
        RunStatus.PARKED,
        heartbeat_at=T0,
        park_reason=ParkReason.HUMAN.value,
        parked_since=T0,
    )
    assert due == T0 + s(bounds.park_budget_human + slack(bounds))


@pytest.mark.parametrize("reason", [ParkReason.ENGINE_LIMIT, ParkReason.PLATFORM_INTERRUPT])
def test_a_polled_park_is_due_when_its_heartbeat_dies(bounds: Settings, reason: ParkReason) -> None:
    due = deadlines.compute(
        bounds,
        RunStatus.PARKED,
        heartbeat_at=T0,
        park_reason=reason.value,
        parked_since=T0,
        waiting_until=T0 + s(10_000),
    )
    assert due == T0 + s(bounds.heartbeat_timeout + slack(bounds))


def test_a_polled_park_past_its_budget_is_due_at_the_budget(bounds: Settings) -> None:
    due = deadlines.compute(
        bounds,
        RunStatus.PARKED,
        heartbeat_at=T0,
        park_reason=ParkReason.PLATFORM_INTERRUPT.value,
        parked_since=T0 - s(bounds.park_budget_platform_interrupt),
    )
    assert due == T0 + s(slack(bounds))


def test_park_expiry_is_the_budget_unless_a_later_waiting_until(bounds: Settings) -> None:
    budget = bounds.park_budget_engine_limit
    reason = ParkReason.ENGINE_LIMIT.value
    assert deadlines.park_expiry(bounds, reason, T0, None) == T0 + s(budget)
    assert deadlines.park_expiry(bounds, reason, T0, T0 + s(budget / 2)) == T0 + s(budget)
    assert deadlines.park_expiry(bounds, reason, T0, T0 + s(budget * 3)) == T0 + s(budget * 3)
    assert deadlines.park_expiry(bounds, "unknown", T0, None) == T0 + s(bounds.park_budget_default)


_OFFSETS = st.floats(min_value=-1e5, max_value=1e5, allow_nan=False)


@PROPERTY
@given(
    status=st.sampled_from(sorted(RUN_LIVE)),
    reason=st.sampled_from([None, *ParkReason]),
    parked_for=st.none() | _OFFSETS,
    waiting_in=st.none() | _OFFSETS,
    cancel_in=st.none() | _OFFSETS,
)
def test_no_deadline_outlives_a_dead_heartbeat_except_an_unattended_park_or_a_cancel_grace(
    tmp_path: Path,
    status: RunStatus,
    reason: ParkReason | None,
    parked_for: float | None,
    waiting_in: float | None,
    cancel_in: float | None,
) -> None:
    settings = make_settings(tmp_path)

    def at(offset: float | None) -> datetime | None:
        return None if offset is None else T0 + s(offset)

    due = deadlines.compute(
        settings,
        status,
        heartbeat_at=T0,
        park_reason=reason.value if reason else None,
        parked_since=at(parked_for),
        waiting_until=at(waiting_in),
        cancel_requested_at=at(cancel_in),
    )
    bound = deadlines.heartbeat_expiry(settings, T0)
    if status is RunStatus.PARKED and parked_for is not None and reason in UNATTENDED_PARKS:
        bound = deadlines.park_expiry(settings, reason.value, T0 + s(parked_for), at(waiting_in))
    if status is RunStatus.CANCELLING and cancel_in is not None:
        bound = max(bound, T0 + s(cancel_in + settings.cancel_grace))
    # A deadline is never stated in the past: a condition already true counts from the
    # time it is stated (here the heartbeat, T0), as test_a_deadline_is_never_stated_in_the_past.
    bound = max(bound, T0)
    assert due <= bound + s(slack(settings))


# -- health -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", sorted(RUN_TERMINAL))
def test_a_terminal_run_has_ended_even_long_after(bounds: Settings, status: RunStatus) -> None:
    assert _health(bounds, _run(status), T0 + s(10**6)) is Health.ENDED


@pytest.mark.parametrize(
    "status", [RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.CANCELLING]
)
def test_a_moving_run_works_until_its_heartbeat_dies(bounds: Settings, status: RunStatus) -> None:
    run = _run(status)
    timeout = bounds.heartbeat_timeout
    assert _health(bounds, run, T0) is Health.WORKING
    assert _health(bounds, run, T0 + s(timeout)) is Health.WORKING  # not yet past
    assert _health(bounds, run, T0 + s(timeout + 0.001)) is Health.STALLED


def test_a_run_never_stamped_counts_from_its_creation(bounds: Settings) -> None:
    run = _run(RunStatus.QUEUED, heartbeat_at=None)
    assert _health(bounds, run, T0 + s(1)) is Health.WORKING
    assert _health(bounds, run, T0 + s(bounds.heartbeat_timeout + 1)) is Health.STALLED


def test_a_run_queued_behind_its_concurrency_key_is_waiting(bounds: Settings) -> None:
    run = _run(RunStatus.QUEUED, concurrency="queued")
    assert _health(bounds, run, T0 + s(10**5)) is Health.WAITING


def test_a_human_park_waits_within_its_budget_even_with_a_dead_heartbeat(
    bounds: Settings,
) -> None:
    run = _run(RunStatus.PARKED, park_reason=ParkReason.HUMAN.value, parked_since=T0)
    assert _health(bounds, run, T0 + s(1)) is Health.WAITING
    assert _judge(bounds, run, T0 + s(bounds.heartbeat_timeout + 1)).heartbeat_dead
    assert _health(bounds, run, T0 + s(bounds.heartbeat_timeout + 1)) is Health.WAITING
    assert _health(bounds, run, T0 + s(bounds.park_budget_human)) is Health.WAITING
    past = T0 + s(bounds.park_budget_human + 0.001)
    assert _judge(bounds, run, past).park_expired
    assert _health(bounds, run, past) is Health.STALLED


@pytest.mark.parametrize("reason", [ParkReason.ENGINE_LIMIT, ParkReason.PLATFORM_INTERRUPT])
def test_a_polled_park_with_a_dead_heartbeat_is_stalled(
    bounds: Settings, reason: ParkReason
) -> None:
    run = _run(RunStatus.PARKED, park_reason=reason.value, parked_since=T0)
    assert _health(bounds, run, T0 + s(1)) is Health.WAITING
    assert _health(bounds, run, T0 + s(bounds.heartbeat_timeout + 1)) is Health.STALLED


def test_a_polled_park_past_its_budget_is_stalled_even_with_a_fresh_heartbeat(
    bounds: Settings,
) -> None:
    budget = bounds.park_budget_engine_limit
    run = _run(
        RunStatus.PARKED,
        park_reason=ParkReason.ENGINE_LIMIT.value,
        parked_since=T0,
        heartbeat_at=T0 + s(budget),
    )
    assert _health(bounds, run, T0 + s(budget)) is Health.WAITING
    assert _health(bounds, run, T0 + s(budget + 1)) is Health.STALLED


def test_a_waiting_until_beyond_the_budget_keeps_a_park_waiting(bounds: Settings) -> None:
    budget = bounds.park_budget_engine_limit
    run = _run(
        RunStatus.PARKED,
        park_reason=ParkReason.ENGINE_LIMIT.value,
        parked_since=T0,
        waiting_until=T0 + s(budget * 2),
        heartbeat_at=T0 + s(budget + 5),
    )
    assert _health(bounds, run, T0 + s(budget + 6)) is Health.WAITING
    assert not _judge(bounds, run, T0 + s(budget * 2)).park_expired
    assert _judge(bounds, run, T0 + s(budget * 2 + 1)).park_expired


def test_park_expired_is_false_for_a_run_that_is_not_parked(bounds: Settings) -> None:
    run = _run(RunStatus.RUNNING, park_reason="human", parked_since=T0 - s(10**6))
    assert not _judge(bounds, run, T0).park_expired


# -- explain (reads the same derivation) ---------------------------------------------------


def _explained(settings: Settings, run: Run, now: datetime) -> str:
    judged = _judge(settings, run, now)
    for name, value in _FILLED.items():
        if getattr(run, name) is None:
            setattr(run, name, value)
    record = to_record(settings, run, [], now, health=judged.health)
    text: str = explain(settings, record, judged, now)["text"]
    return text


def test_explain_says_stalled_and_who_moves_it(bounds: Settings) -> None:
    text = _explained(bounds, _run(RunStatus.RUNNING), T0 + s(60))
    assert "health: stalled" in text
    assert "STALLED" in text
    assert "sweeper" in text


def test_explain_of_a_human_park_says_how_to_answer(bounds: Settings) -> None:
    run = _run(RunStatus.PARKED, park_reason=ParkReason.HUMAN.value, parked_since=T0)
    text = _explained(bounds, run, T0 + s(1))
    assert "health: waiting" in text
    assert "orchestration answer r" in text


def test_a_deadline_is_never_stated_in_the_past(bounds: Settings) -> None:
    # Chaos finding: a run re-armed after its park had expired was stamped with a deadline
    # already behind the clock. The sweeper needs the slack from *now* to act.
    now = T0 + s(600)
    parked = deadlines.compute(
        bounds,
        RunStatus.PARKED,
        heartbeat_at=T0,
        park_reason="human",
        parked_since=T0,
        now=now,
    )
    assert parked == now + s(slack(bounds))
