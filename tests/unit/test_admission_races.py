"""Two writes of one owner checked in transactions race for its last place: the second waits
for the first's commit and counts what it wrote (``admission.serialised``). PostgreSQL only:
SQLite has one writer at a time, and a transaction that read before another wrote fails at
its own write."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.orm import Session

from orchestration.core.db import get_engine, utcnow
from orchestration.core.errors import LimitExceeded
from orchestration.core.settings import Settings
from orchestration.runs import artifacts
from orchestration.workflows import registry
from tests.unit.support import step_spec, workflow

pytestmark = pytest.mark.postgresql_only("SQLite has one writer at a time: no such race")

OWNER = "owner-1"
#: How long the second write is watched while the first holds its transaction open.
WATCHED_S = 0.5

Write = Callable[[Session, Settings, int], Any]


def _race(settings: Settings, write: Write) -> BaseException | None:
    """``write`` 1 in a transaction left open, ``write`` 2 in another meanwhile: check the
    second waits for the first, and return how it ended once the first commits."""
    engine = get_engine(settings.database_url)
    ended: list[BaseException | None] = []

    def second() -> None:
        try:
            with Session(engine) as session, session.begin():
                write(session, settings, 2)
            ended.append(None)
        except BaseException as exc:  # the refusal (or anything else) is the test's to read
            ended.append(exc)

    with Session(engine) as first:
        with first.begin():
            write(first, settings, 1)
            other = threading.Thread(target=second)
            other.start()
            other.join(WATCHED_S)
            assert other.is_alive(), f"the second write did not wait for the first: {ended}"
        other.join(30)
    assert not other.is_alive()
    return ended[0]


def _definition(session: Session, settings: Settings, n: int) -> Any:
    data = workflow(step_spec(task=f"task {n}"), name=f"flow-{n}")
    return registry.register(session, settings, OWNER, data, utcnow(), shared=False)


def _schedule(session: Session, settings: Settings, n: int) -> Any:
    data = {"name": f"every-{n}", "schedule": {"every": 60}, "steps": [step_spec("a")]}
    return registry.register(session, settings, OWNER, data, utcnow(), shared=False)


def _artifact(session: Session, settings: Settings, n: int) -> Any:
    kept = artifacts.keep(
        session,
        settings,
        owner=OWNER,
        run_pk=f"run-{n}",
        step_index=0,
        value=str(n) * 3000,
        now=utcnow(),
    )
    if isinstance(kept, str):
        raise LimitExceeded("stored_bytes", kept)
    return kept


@pytest.mark.parametrize(
    ("write", "overrides", "refused_by"),
    [
        (_definition, {"max_definitions_per_owner": 1}, "ORCH_MAX_DEFINITIONS_PER_OWNER"),
        (_schedule, {"max_schedules_per_owner": 1}, "ORCH_MAX_SCHEDULES_PER_OWNER"),
        (
            _artifact,
            {"inline_output_bytes": 100, "max_stored_bytes_per_owner": 4000},
            "ORCH_MAX_STORED_BYTES_PER_OWNER",
        ),
    ],
    ids=["definitions", "schedules", "stored_bytes"],
)
def test_the_second_of_two_writes_racing_for_the_last_place_waits_and_is_refused(
    settings_factory: Callable[..., Settings],
    write: Write,
    overrides: dict[str, int],
    refused_by: str,
) -> None:
    ended = _race(settings_factory(**overrides), write)
    assert isinstance(ended, LimitExceeded), ended
    assert refused_by in ended.problem
