"""Workflow schedules (issue 14, "Schedules"): fire times, one launch per fire whatever the
number of passes, the catch-up window, the overlap policies, pause and resume. ``now`` is
passed in: nothing sleeps."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from orchestration.core.errors import ValidationError
from orchestration.core.followups import Done
from orchestration.core.models import Run, ScheduleFire
from orchestration.core.settings import Settings
from orchestration.service import Orchestrator
from orchestration.upkeep import schedule_controls, schedules
from orchestration.workflows import registry
from orchestration.workflows.schedules import ScheduleSpec, next_fires
from tests.unit.support import RecordingDispatcher, step_spec

OWNER = "owner-1"
T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
SCHEMA = {"type": "object", "required": ["topic"], "properties": {"topic": {"type": "string"}}}


def _workflow(**schedule: Any) -> dict[str, Any]:
    body = {"every": 10, "args": {"topic": "otters"}, **schedule}
    return {
        "name": "nightly",
        "args_schema": SCHEMA,
        "schedule": body,
        "steps": [step_spec("a", task="Research {{ args.topic }}")],
    }


@pytest.fixture
def orch(settings: Settings) -> Orchestrator:
    return Orchestrator(settings, RecordingDispatcher())


def _register(orch: Orchestrator, data: dict[str, Any], at: datetime = T0) -> None:
    orch.transact(
        lambda session: Done(
            registry.register(session, orch.settings, OWNER, data, at, shared=False)
        )
    )


def _pass(orch: Orchestrator, now: datetime) -> dict[str, Any]:
    return schedules.fire(orch.transact, orch.settings, now)


def _fires(orch: Orchestrator) -> list[tuple[int, str, str | None]]:
    """(seconds after T0, status, reason's first word) of every recorded fire, in order."""

    def read(session: Any) -> Done[list[tuple[int, str, str | None]]]:
        rows = session.scalars(select(ScheduleFire).order_by(ScheduleFire.fire_at))
        return Done(
            [
                (
                    int((row.fire_at - T0).total_seconds()),
                    row.status,
                    (row.reason or "").split(" ")[0] or None,
                )
                for row in rows
            ]
        )

    return orch.transact(read)


def _runs(orch: Orchestrator) -> list[Run]:
    return orch.transact(
        lambda session: Done(list(session.scalars(select(Run).order_by(Run.created_at))))
    )


def test_fire_times_cron_in_its_zone_and_every_on_the_epoch() -> None:
    paris = ScheduleSpec(cron="30 9 * * *", timezone="Europe/Paris")
    assert next_fires(paris, T0, 2) == [
        datetime(2026, 12, 2, 8, 30, tzinfo=UTC),  # 09:30 in Paris is 08:30 UTC in winter
        datetime(2026, 12, 3, 8, 30, tzinfo=UTC),
    ]
    quarter = ScheduleSpec(cron="*/15 * * * *")
    assert next_fires(quarter, T0 + timedelta(minutes=1), 2) == [
        T0 + timedelta(minutes=15),
        T0 + timedelta(minutes=30),
    ]
    every = ScheduleSpec(every=7)
    start = datetime.fromtimestamp(700, UTC)
    assert next_fires(every, start, 2) == [
        datetime.fromtimestamp(707, UTC),
        datetime.fromtimestamp(714, UTC),
    ]


def test_each_due_fire_launches_once_with_its_derived_request_id(orch: Orchestrator) -> None:
    _register(orch, _workflow(overlap="enqueue"))
    assert _pass(orch, T0 + timedelta(seconds=25))["launched"] == 2
    assert _pass(orch, T0 + timedelta(seconds=25))["launched"] == 0  # a replayed tick
    runs = _runs(orch)
    assert [run.request_id for run in runs] == [
        schedules.request_id(OWNER, "nightly", 1, T0 + timedelta(seconds=s)) for s in (10, 20)
    ]
    assert {(run.workflow_name, run.workflow_version, run.args["topic"]) for run in runs} == {
        ("nightly", 1, "otters")
    }
    assert _fires(orch) == [(10, "launched", None), (20, "launched", None)]


def test_two_passes_that_took_the_same_fires_launch_each_fire_once(orch: Orchestrator) -> None:
    _register(orch, _workflow(overlap="enqueue"))
    now = T0 + timedelta(seconds=35)
    first, _ = orch.transact(lambda session: Done(schedules.take(session, orch.settings, now)))
    second, _ = orch.transact(lambda session: Done(schedules.take(session, orch.settings, now)))
    assert schedules.carry_out(orch.transact, orch.settings, second, now)["launched"] == 3
    late = schedules.carry_out(orch.transact, orch.settings, first, now)
    assert (late["launched"], late["skipped"]) == (0, 0)
    assert len(_runs(orch)) == 3
    assert [status for _, status, _ in _fires(orch)] == ["launched"] * 3


def test_missed_fires_inside_the_window_launch_and_older_ones_are_skipped(
    orch: Orchestrator,
) -> None:
    _register(orch, _workflow(overlap="enqueue", catchup_window=20))
    report = _pass(orch, T0 + timedelta(seconds=55))
    assert (report["launched"], report["skipped"]) == (2, 3)
    assert _fires(orch) == [
        (10, "skipped", "missed"),
        (20, "skipped", "missed"),
        (30, "skipped", "missed"),  # 25 s late: over the window of 20
        (40, "launched", None),
        (50, "launched", None),
    ]
    assert len(_runs(orch)) == 2


def test_overlap_skip_records_skipped_while_the_previous_run_lives(orch: Orchestrator) -> None:
    _register(orch, _workflow(overlap="skip"))
    _pass(orch, T0 + timedelta(seconds=10))
    _pass(orch, T0 + timedelta(seconds=20))
    (live,) = _runs(orch)
    orch.cancel(live.id, owner=OWNER)
    _pass(orch, T0 + timedelta(seconds=30))
    assert _fires(orch) == [(10, "launched", None), (20, "skipped", "run"), (30, "launched", None)]


def test_overlap_enqueue_lets_runs_overlap(orch: Orchestrator) -> None:
    _register(orch, _workflow(overlap="enqueue"))
    _pass(orch, T0 + timedelta(seconds=10))
    _pass(orch, T0 + timedelta(seconds=20))
    assert [run.status for run in _runs(orch)] == ["queued", "queued"]


def test_overlap_cancel_previous_cancels_the_live_run_then_launches(orch: Orchestrator) -> None:
    _register(orch, _workflow(overlap="cancel_previous"))
    _pass(orch, T0 + timedelta(seconds=10))
    _pass(orch, T0 + timedelta(seconds=20))
    first, second = _runs(orch)
    assert (first.status, first.stop_reason, second.status) == (
        "cancelled",
        "cancel_requested",
        "queued",
    )
    assert _pass(orch, T0 + timedelta(seconds=20))["launched"] == 0  # replayed: no second cancel
    assert orch.get(second.id, owner=OWNER).status == "queued"


def test_a_paused_schedule_records_nothing_and_resume_catches_up(orch: Orchestrator) -> None:
    _register(orch, _workflow(overlap="enqueue", catchup_window=15))
    assert orch.transact(
        lambda session: Done(schedule_controls.pause(session, OWNER, "nightly", T0))
    )
    assert _pass(orch, T0 + timedelta(seconds=40))["due"] == 0
    assert _fires(orch) == []
    assert orch.transact(lambda session: Done(schedule_controls.resume(session, OWNER, "nightly")))
    _pass(orch, T0 + timedelta(seconds=40))
    assert _fires(orch) == [
        (10, "skipped", "missed"),
        (20, "skipped", "missed"),
        (30, "launched", None),
        (40, "launched", None),
    ]
    with pytest.raises(ValidationError) as refused:
        orch.transact(lambda session: Done(schedule_controls.pause(session, OWNER, "other", T0)))
    assert refused.value.field == "name"


def test_the_listing_shows_next_fires_pause_and_the_runs_fires_made(orch: Orchestrator) -> None:
    _register(orch, _workflow(overlap="enqueue"))
    _pass(orch, T0 + timedelta(seconds=10))
    now = T0 + timedelta(seconds=12)
    (shown,) = orch.transact(lambda session: Done(schedule_controls.listing(session, OWNER, now)))
    (run,) = _runs(orch)
    assert shown["ref"] == "nightly@1" and shown["paused"] is False
    assert shown["next_fires"][:2] == [(T0 + timedelta(seconds=s)).isoformat() for s in (20, 30)]
    assert shown["last_fires"][0]["run_id"] == run.id
    assert shown["last_fires"][0]["run_status"] == "queued"


def test_a_refused_launch_is_recorded_failed_once(
    settings_factory: Callable[..., Settings],
) -> None:
    orch = Orchestrator(settings_factory(max_active_runs_per_owner=1), RecordingDispatcher())
    _register(orch, _workflow(overlap="enqueue"))
    orch.launch({"name": "filler", "steps": [step_spec()]}, owner=OWNER)
    assert _pass(orch, T0 + timedelta(seconds=10))["failed"] == 1
    assert _pass(orch, T0 + timedelta(seconds=10))["failed"] == 0
    assert _fires(orch) == [(10, "failed", "limit_exceeded:")]


@pytest.mark.parametrize(
    ("schedule", "field"),
    [
        ({"cron": "61 * * * *"}, "schedule.cron"),
        ({"cron": "*/5 * * * * *"}, "schedule.cron"),  # seconds: use every
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "schedule.timezone"),
        ({"every": 10, "overlap": "sometimes"}, "schedule.overlap"),
        ({"every": 10, "catchup_window": -1}, "schedule.catchup_window"),
        ({"every": 10, "catchup_window": 10**9}, "schedule.catchup_window"),
        ({"every": 0}, "schedule.every"),
        ({"cron": "* * * * *", "every": 10}, "schedule"),
        ({"every": 10, "args": {"topic": 3}}, "schedule.args.topic"),
        ({"every": 10, "args": {}}, "schedule.args.topic"),
        ({"every": 10, "when": "often"}, "schedule.when"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_field(
    orch: Orchestrator, schedule: dict[str, Any], field: str
) -> None:
    data = _workflow()
    data["schedule"] = {"args": {"topic": "otters"}, **schedule}
    with pytest.raises(ValidationError) as refused:
        _register(orch, data)
    assert refused.value.field == field


def test_a_shared_definition_cannot_carry_a_schedule(orch: Orchestrator) -> None:
    with pytest.raises(ValidationError) as refused:
        orch.register_workflow(_workflow(), owner=OWNER, shared=True)
    assert refused.value.field == "schedule"


def test_a_workflow_without_a_schedule_keeps_its_stored_form(orch: Orchestrator) -> None:
    plain = {"name": "plain", "steps": [step_spec()]}
    found, _ = orch.register_workflow(plain, owner=OWNER)
    assert "schedule" not in found.definition
    scheduled, _ = orch.register_workflow(_workflow(), owner=OWNER)
    assert scheduled.definition["schedule"] == {
        "every": 10,
        "timezone": "UTC",
        "args": {"topic": "otters"},
        "overlap": "skip",
        "catchup_window": 3600,
    }


def test_only_the_latest_version_is_scheduled(orch: Orchestrator) -> None:
    _register(orch, _workflow(overlap="enqueue"))
    _register(orch, {"name": "nightly", "steps": [step_spec()]}, T0 + timedelta(seconds=5))
    assert _pass(orch, T0 + timedelta(seconds=30))["due"] == 0
    assert _fires(orch) == []


def test_the_dashboard_shows_next_fire_times_and_the_run_each_fire_made(
    orch: Orchestrator, settings: Settings
) -> None:
    import re

    from fastapi.testclient import TestClient

    from orchestration.core.db import session_scope
    from orchestration.surfaces.api import tokens
    from orchestration.surfaces.api.app import create_app

    _register(orch, _workflow(overlap="enqueue"))
    _pass(orch, T0 + timedelta(seconds=10))
    (run,) = _runs(orch)
    with session_scope(settings.database_url) as session:
        token = tokens.create(session, OWNER, "t", now=T0)
    clocked = Orchestrator(settings, None, clock=lambda: T0 + timedelta(seconds=12))
    page = TestClient(create_app(clocked), headers={"Authorization": f"Bearer {token}"}).get(
        "/dashboard/schedules"
    )
    assert page.status_code == 200
    nexts = re.findall(r'<span class="mono next-fire">([^<]+)</span>', page.text)
    assert nexts[:2] == [(T0 + timedelta(seconds=s)).isoformat() for s in (20, 30)]
    assert f'href="/dashboard/runs/{run.id}"' in page.text
