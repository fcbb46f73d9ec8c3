"""The schedule pass is fair (issue 30): due schedules are selected in SQL, each owner takes a
bounded share of a pass round robin, what a pass leaves fires next pass with its lateness
recorded, and registration refuses a schedule over the owner's budget or an ``every``
shorter than the pass interval. ``now`` is passed in: nothing sleeps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, select

from orchestration.core.db import get_engine
from orchestration.core.errors import LimitExceeded, ValidationError
from orchestration.core.followups import Done
from orchestration.core.models import Run, ScheduleEntry, WorkflowDefinition
from orchestration.core.settings import Settings
from orchestration.service import Orchestrator
from orchestration.upkeep import schedule_controls, schedules
from orchestration.workflows import registry
from tests.unit.support import RecordingDispatcher, step_spec

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def _workflow(name: str, **schedule: Any) -> dict[str, Any]:
    return {
        "name": name,
        "schedule": {"every": 10, "overlap": "enqueue", **schedule},
        "steps": [step_spec("a")],
    }


def _orch(settings_factory: Callable[..., Settings], **overrides: Any) -> Orchestrator:
    return Orchestrator(settings_factory(**overrides), RecordingDispatcher())


def _register(orch: Orchestrator, owner: str, data: dict[str, Any]) -> None:
    orch.transact(
        lambda session: Done(
            registry.register(session, orch.settings, owner, data, T0, shared=False)
        )
    )


def _launched(orch: Orchestrator) -> Counter[str]:
    """Runs launched, by owner."""
    return orch.transact(lambda session: Done(Counter(session.scalars(select(Run.owner)).all())))


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_storm_owner_takes_its_share_and_a_plain_owner_fires_on_time(
    settings_factory: Callable[..., Settings],
) -> None:
    orch = _orch(settings_factory, schedule_fires_per_owner=3)
    for index in range(12):
        _register(orch, "storm", _workflow(f"s{index:02}"))
    _register(orch, "plain", _workflow("daily"))

    first = schedules.fire(orch.transact, orch.settings, _at(10))
    assert (first["due"], first["launched"], first["left"]) == (13, 4, 9)
    assert _launched(orch) == {"storm": 3, "plain": 1}

    second = schedules.fire(orch.transact, orch.settings, _at(20))
    assert _launched(orch) == {"storm": 6, "plain": 2}
    assert (
        second["left"] == 12
    )  # every storm schedule is still due (s03..s05 at 20, the rest at 10)

    (plain,) = orch.transact(lambda s: Done(schedule_controls.listing(s, "plain", _at(20))))
    assert [fire["late_seconds"] for fire in plain["last_fires"]] == [0.0, 0.0]
    storm = orch.transact(lambda s: Done(schedule_controls.listing(s, "storm", _at(20))))
    late = {shown["name"]: shown for shown in storm}
    # s03..s05 waited one pass for their fire at 10: recorded 10 s late.
    assert late["s03"]["last_fires"][0]["late_seconds"] == 10.0
    assert late["s11"]["behind_seconds"] == 10.0 and late["s11"]["last_fires"] == []


def test_a_pass_takes_owners_round_robin_within_its_size(
    settings_factory: Callable[..., Settings],
) -> None:
    orch = _orch(settings_factory, schedule_fires_per_owner=2, schedule_fires_per_pass=4)
    for owner in ("a", "b", "c", "d"):
        for name in ("x", "y"):
            _register(orch, owner, _workflow(name))
    report = schedules.fire(orch.transact, orch.settings, _at(10))
    assert (report["launched"], report["left"]) == (4, 4)
    assert _launched(orch) == {"a": 1, "b": 1, "c": 1, "d": 1}


def test_a_backlogged_schedule_goes_back_in_line_until_its_owner_share_is_spent(
    settings_factory: Callable[..., Settings],
) -> None:
    orch = _orch(settings_factory, schedule_fires_per_owner=3)
    _register(orch, "o", _workflow("n"))
    report = schedules.fire(orch.transact, orch.settings, _at(50))
    assert (report["launched"], report["left"], report["late_max"]) == (3, 1, 40.0)
    report = schedules.fire(orch.transact, orch.settings, _at(50))
    assert (report["launched"], report["left"]) == (2, 0)


def test_the_pass_reads_only_the_definitions_it_fires(
    settings_factory: Callable[..., Settings],
) -> None:
    orch = _orch(settings_factory)
    for index in range(30):
        _register(orch, f"owner-{index}", _workflow("yearly", every=None, cron="0 0 1 1 *"))
    _register(orch, "due", _workflow("n"))
    engine = get_engine(orch.settings.database_url)
    seen: list[str] = []

    def listener(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", listener)
    try:
        taken, due = orch.transact(lambda s: Done(schedules.take(s, orch.settings, _at(10))))
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert due == 1 and [one.schedule.owner for one in taken] == ["due"]
    (statement,) = seen
    # One statement: the due ones are chosen in SQL, and only their definitions are read.
    assert "next_fire_at <=" in statement and "row_number" in statement.lower()


def test_registration_refuses_a_schedule_over_the_owner_budget(
    settings_factory: Callable[..., Settings],
) -> None:
    orch = _orch(settings_factory, max_schedules_per_owner=2)
    _register(orch, "o", _workflow("one"))
    _register(orch, "o", _workflow("two"))
    with pytest.raises(LimitExceeded) as refused:
        _register(orch, "o", _workflow("three"))
    assert refused.value.field == "schedule"
    assert "ORCH_MAX_SCHEDULES_PER_OWNER" in str(refused.value)

    def definitions(session: Any) -> Done[int]:
        return Done(session.scalar(select(func.count()).select_from(WorkflowDefinition)))

    assert orch.transact(definitions) == 2  # the refused registration wrote nothing
    _register(orch, "o", _workflow("two", every=20))  # a new version of a scheduled name
    _register(orch, "o", {"name": "plain", "steps": [step_spec()]})  # no schedule
    _register(orch, "other", _workflow("three"))  # another owner's budget
    entries = orch.transact(
        lambda s: Done(sorted(s.execute(select(ScheduleEntry.owner, ScheduleEntry.name)).all()))
    )
    assert entries == [("o", "one"), ("o", "two"), ("other", "three")]


def test_every_shorter_than_the_schedule_interval_is_refused_naming_both(
    settings_factory: Callable[..., Settings],
) -> None:
    orch = _orch(settings_factory, schedule_interval=30.0)
    with pytest.raises(ValidationError) as refused:
        _register(orch, "o", _workflow("fast", every=10))
    assert refused.value.field == "schedule.every"
    assert "ORCH_SCHEDULE_INTERVAL" in str(refused.value)
    assert orch.transact(lambda s: Done(s.scalar(select(func.count(WorkflowDefinition.pk))))) == 0
    _register(orch, "o", _workflow("slow", every=30))
