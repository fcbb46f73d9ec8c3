"""The database's own guard of the state machine (``core.status_triggers``, migration 0015):
generated from ``core.states``' tables, it refuses what the tables do not allow from any
writer, and writes the journal of every change from the row's ``cause``."""

from __future__ import annotations

import importlib
from itertools import product

import pytest
from sqlalchemy import insert, update
from sqlalchemy.exc import IntegrityError

from orchestration.core import states, status_triggers
from orchestration.core.db import session_scope
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import RunStatus, StepStatus
from tests.unit.support import T0, events_of, force_step, insert_run, run_row, steps_of


def _newest_trigger_migration() -> status_triggers.Machine:
    module = importlib.import_module(
        "orchestration.migrations.versions.0015_status_journal_triggers"
    )
    machine: status_triggers.Machine = module.MACHINE
    return machine


def test_the_migration_holds_the_tables_of_the_state_machine() -> None:
    """A change of ``states`` needs a migration that re-creates the triggers."""
    frozen, now = _newest_trigger_migration(), status_triggers.current()
    assert {k: sorted(v) for k, v in frozen.run_moves.items()} == {
        k: sorted(v) for k, v in now.run_moves.items()
    }
    assert {k: sorted(v) for k, v in frozen.step_moves.items()} == {
        k: sorted(v) for k, v in now.step_moves.items()
    }
    assert sorted(frozen.run_initial) == sorted(now.run_initial)
    assert sorted(frozen.step_initial) == sorted(now.step_initial)
    assert frozen.step_silent == now.step_silent


@pytest.mark.parametrize(
    ("source", "to"),
    [(a, b) for a, b in product(RunStatus, RunStatus) if a is not b],
)
def test_any_writer_of_a_run_status_is_held_to_the_table(
    settings: Settings, source: RunStatus, to: RunStatus
) -> None:
    """A raw ``UPDATE`` (no guard of its own): a move the table allows is journaled once from
    the row's cause; any other is refused by the database and writes nothing."""
    run_id = insert_run(settings, source.value)
    before = len(events_of(settings, run_id))
    moved = update(Run).where(Run.id == run_id).values(status=to.value, cause="raw", updated_at=T0)
    if to in states.RUN_TRANSITIONS[source]:
        with session_scope(settings.database_url) as session:
            session.execute(moved)
        journal = events_of(settings, run_id)[before:]
        assert [(e.from_status, e.to_status, e.cause) for e in journal] == [
            (source.value, to.value, "raw")
        ]
    else:
        with pytest.raises(IntegrityError), session_scope(settings.database_url) as session:
            session.execute(moved)
        assert run_row(settings, run_id).status == source.value
        assert len(events_of(settings, run_id)) == before


@pytest.mark.parametrize(
    ("source", "to"),
    [(a, b) for a, b in product(StepStatus, StepStatus) if a is not b],
)
def test_any_writer_of_a_step_status_is_held_to_the_table(
    settings: Settings, source: StepStatus, to: StepStatus
) -> None:
    run_id = insert_run(settings, "running")

    force_step(settings, run_id, 0, status=source.value)
    before = len(events_of(settings, run_id))
    moved = (
        update(Step)
        .where(Step.run_id == run_id, Step.index == 0)
        .values(status=to.value, cause="raw", updated_at=T0)
    )
    if to in states.STEP_TRANSITIONS[source]:
        with session_scope(settings.database_url) as session:
            session.execute(moved)
        journal = events_of(settings, run_id)[before:]
        assert [(e.step_id, e.from_status, e.to_status) for e in journal] == [
            ("s0", source.value, to.value)
        ]
    else:
        with pytest.raises(IntegrityError), session_scope(settings.database_url) as session:
            session.execute(moved)
        assert steps_of(settings, run_id)[0].status == source.value


def test_a_status_change_without_a_cause_is_refused(settings: Settings) -> None:
    run_id = insert_run(settings, "queued")
    with pytest.raises(IntegrityError), session_scope(settings.database_url) as session:
        session.execute(update(Run).where(Run.id == run_id).values(status="running", cause=None))
    assert run_row(settings, run_id).status == "queued"


@pytest.mark.parametrize("status", list(RunStatus))
def test_a_new_run_starts_only_in_an_initial_status_and_is_journaled(
    settings: Settings, status: RunStatus
) -> None:
    row = {
        "id": f"new-{status.value}",
        "owner": "o",
        "request_id": f"r-{status.value}",
        "fingerprint": "f",
        "workflow_name": "w",
        "workflow": {},
        "args": {},
        "status": status.value,
        "cause": "written new",
        "created_at": T0,
        "updated_at": T0,
        "task_ids": [],
        "current_step": 0,
        "rearms": 0,
        "needs_review": False,
    }
    if status in states.RUN_INITIAL:
        with session_scope(settings.database_url) as session:
            session.execute(insert(Run).values(row))
        journal = events_of(settings, row["id"])
        assert [(e.from_status, e.to_status, e.cause, e.at) for e in journal] == [
            (None, status.value, "written new", T0)
        ]
    else:
        with pytest.raises(IntegrityError), session_scope(settings.database_url) as session:
            session.execute(insert(Run).values(row))
