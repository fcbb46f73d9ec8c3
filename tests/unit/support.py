"""Helpers for the unit tier: fixed times, run builders, row snapshots, a recording dispatcher.

Nothing here starts a service: every database is a SQLite file in the test's ``tmp_path``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from orchestration.core import status_triggers
from orchestration.core.db import session_scope
from orchestration.core.followups import ChainPlan
from orchestration.core.models import Run, RunEvent, Step
from orchestration.core.settings import Settings
from orchestration.execution import Outcome, Poll, Stepper
from orchestration.runs import concurrency, launching
from orchestration.runtime.executor import Executor

#: Property tests: modest example counts, no per-example deadline (SQLite I/O varies), and the
#: database fixture shared by the examples of one test (each example builds its own rows).
hypothesis_settings.register_profile(
    "unit",
    max_examples=100,
    deadline=None,
    database=None,  # no example database written into the working tree
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PROPERTY = hypothesis_settings.get_profile("unit")

#: A fixed "now" for tests whose time is a parameter.
T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)

#: Shrunk, consistent bounds (the integration tier uses the same shape).
FAST: dict[str, Any] = {
    "heartbeat_timeout": 8.0,
    "max_poll_interval_limit": 2.0,
    "provider_timeout": 3.0,
    "visibility_timeout": 60.0,
    "sweep_interval": 1.0,
    "cancel_grace": 2.0,
    "max_rearms": 2,
    "park_budget_human": 100.0,
    "park_budget_engine_limit": 50.0,
    "park_budget_platform_interrupt": 30.0,
    "park_budget_default": 40.0,
    "effect_attempts": 2,
    "effect_backoff": 0.01,
    # Loopback is granted explicitly: the default list is empty.
    "provider_hosts": "localhost,127.0.0.0/8,::1",
}


def make_settings(tmp_path: Path, name: str = "t", **overrides: Any) -> Settings:
    """Settings on SQLite files in ``tmp_path``; ``overrides`` replace :data:`FAST` values."""
    values: dict[str, Any] = {
        "database_url": f"sqlite:///{tmp_path / (name + '.db')}",
        "scripted_url": f"sqlite:///{tmp_path / (name + '.scripted.db')}",
        "broker_url": "memory://",
        **FAST,
        **overrides,
    }
    return Settings(**values)


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def step_spec(step_id: str = "a", *, task: Any = "do it", **fields: Any) -> dict[str, Any]:
    """One scripted step; ``with_`` becomes the ``with:`` options."""
    spec: dict[str, Any] = {
        "id": step_id,
        "provider": "scripted",
        "task": task,
        "poll_interval": 0.1,
        "max_poll_interval": 1.0,
    }
    options = fields.pop("with_", None)
    if options is not None:
        spec["with"] = options
    spec.update(fields)
    return spec


def workflow(*steps: dict[str, Any], name: str = "wf") -> dict[str, Any]:
    return {"name": name, "steps": list(steps) or [step_spec()]}


def launch(
    settings: Settings,
    definition: Any = None,
    args: Any = None,
    *,
    now: datetime = T0,
    owner: str = "owner-1",
    request_id: str | None = None,
    concurrency_key: str | None = None,
    on_conflict: concurrency.OnConflict = concurrency.OnConflict.REJECT,
    dispatcher: Any = None,
) -> str:
    """``launching.launch`` with test defaults (no dispatcher: nothing is sent)."""
    return launching.launch(
        Executor(settings, dispatcher),
        settings,
        workflow() if definition is None else definition,
        args,
        owner=owner,
        request_id=request_id,
        concurrency_key=concurrency_key,
        on_conflict=on_conflict,
        now=now,
    )


def counts(settings: Settings) -> dict[str, int]:
    """Rows in the tables a launch writes."""
    with session_scope(settings.database_url) as session:
        return {
            model.__tablename__: int(session.scalar(select(func.count()).select_from(model)) or 0)
            for model in (Run, Step, RunEvent)
        }


def run_row(settings: Settings, run_id: str) -> Run:
    with session_scope(settings.database_url) as session:
        run = session.get(Run, run_id)
        assert run is not None, run_id
        session.expunge(run)
        return run


def steps_of(settings: Settings, run_id: str) -> list[Step]:
    with session_scope(settings.database_url) as session:
        rows = list(
            session.scalars(select(Step).where(Step.run_id == run_id).order_by(Step.index)).all()
        )
        session.expunge_all()
        return rows


def events_of(settings: Settings, run_id: str) -> list[RunEvent]:
    with session_scope(settings.database_url) as session:
        rows = list(
            session.scalars(
                select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.id)
            ).all()
        )
        session.expunge_all()
        return rows


def snapshot(settings: Settings, run_id: str) -> dict[str, Any]:
    """Every column of the run, its steps and its journal: to prove that nothing was written."""
    runs, steps, events = Run.__table__, Step.__table__, RunEvent.__table__
    with session_scope(settings.database_url) as session:
        run = session.execute(select(runs).where(runs.c.id == run_id)).mappings().one()
        step_rows = session.execute(
            select(steps).where(steps.c.run_id == run_id).order_by(steps.c.index)
        ).mappings()
        event_rows = session.execute(
            select(events).where(events.c.run_id == run_id).order_by(events.c.id)
        ).mappings()
        return {
            "run": dict(run),
            "steps": [dict(row) for row in step_rows],
            "events": [dict(row) for row in event_rows],
        }


def insert_run(
    settings: Settings,
    status: str = "queued",
    *,
    steps: int = 1,
    now: datetime = T0,
    owner: str = "owner-1",
    **values: Any,
) -> str:
    """A run row and its pending steps written straight through the ORM (no launch), for
    table-driven tests that need many runs in a given status."""
    run_id = uuid.uuid4().hex
    definition = workflow(*(step_spec(f"s{index}") for index in range(steps)))
    with unguarded(settings) as session:
        session.add(
            Run(
                id=run_id,
                owner=owner,
                request_id=run_id,
                fingerprint="0" * 64,
                workflow_name=definition["name"],
                workflow=definition,
                args={},
                status=status,
                cause="inserted by a test",
                created_at=now,
                updated_at=now,
                heartbeat_at=now,
                task_ids=[],
                current_step=0,
                rearms=0,
                needs_review=False,
                **values,
            )
        )
        for index in range(steps):
            session.add(
                Step(
                    run_id=run_id,
                    index=index,
                    step_id=f"s{index}",
                    provider="scripted",
                    status="pending",
                    cause="inserted by a test",
                    attempt=1,
                    idempotency_key=f"{run_id}:s{index}:1",
                    polls=0,
                    created_at=now,
                    updated_at=now,
                )
            )
    return run_id


@contextmanager
def unguarded(settings: Settings) -> Iterator[Session]:
    """Test scaffolding only: a transaction in which the database's status guard and journal
    are off (``status_triggers.suspended``), to write a row straight into any status."""
    with (
        session_scope(settings.database_url) as session,
        status_triggers.suspended(session.connection()),
    ):
        yield session
        session.flush()


def force(settings: Settings, run_id: str, **values: Any) -> None:
    """Test scaffolding only: write run columns directly, bypassing the guarded writers."""
    with unguarded(settings) as session:
        session.execute(update(Run).where(Run.id == run_id).values(**values))


def force_step(settings: Settings, run_id: str, index: int, **values: Any) -> None:
    """Test scaffolding only: write step columns directly, bypassing the guarded writers."""
    with unguarded(settings) as session:
        session.execute(
            update(Step).where(Step.run_id == run_id, Step.index == index).values(**values)
        )


@dataclass
class RecordingDispatcher:
    """A task queue (``runtime.executor.TaskQueue``) that records instead of sending."""

    chains: list[ChainPlan] = field(default_factory=list)
    revoked: list[tuple[list[str], bool]] = field(default_factory=list)
    stops: list[tuple[str, int]] = field(default_factory=list)

    def send_chain(self, plan: ChainPlan) -> None:
        self.chains.append(plan)

    def revoke(self, task_ids: list[str], *, terminate: bool) -> None:
        self.revoked.append((list(task_ids), terminate))

    def stop_turns(self, turns: list[tuple[str, int]]) -> None:
        self.stops.extend(turns)


@dataclass
class Clock:
    """A clock the test moves by hand."""

    now: datetime

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def drive(
    stepper: Stepper, run_id: str, index: int = 0, tick: int = 0, *, limit: int = 20
) -> list[Outcome]:
    """Play the task body: feed each Poll's tick back until the step proceeds or halts."""
    outcomes: list[Outcome] = []
    for _ in range(limit):
        outcome = stepper.advance(run_id, index, tick)
        outcomes.append(outcome)
        if not isinstance(outcome, Poll):
            return outcomes
        tick = outcome.tick
    pytest.fail(f"step {index} still polling after {limit} executions: {outcomes}")


def cli(
    settings: Settings, owner: str | None = None, cwd: Path | None = None
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``orchestration ARGV`` in a fresh process on the test's database (and scripted
    provider), as ``owner``: the installed command a user types, not a function call."""
    env = {"ORCH_DATABASE_URL": settings.database_url, "PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:  # a checkout other than the installed one (a worktree)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    if settings.scripted_url:
        env["ORCH_SCRIPTED_URL"] = settings.scripted_url
    if owner is not None:
        env["ORCH_OWNER"] = owner
    command = str(Path(sys.executable).with_name("orchestration"))

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([command, *argv], env=env, capture_output=True, text=True, cwd=cwd)

    return run
