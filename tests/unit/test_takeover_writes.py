"""An execution whose step another execution fenced (took over) writes nothing more to it
but under what it still holds, and never over what the other execution wrote since.

Chaos finding (``net_cut``, the CI profile on Redis): after another process had fenced a
plain run's step, the cut worker wrote the step once: its start, whose answer came back when
the database did, found the run moved and handed the turn's id to the step under its claim
(``execution/releasing.py``). That write read the claim, then wrote guarded by the step's
status alone: a claim committed by a newer execution while it waited on the row was cleared.
Each test here holds a row in a second transaction, lets the first execution's statement
wait on it, and commits: the statement must judge what was committed meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text, update
from sqlalchemy.orm import Session

from orchestration.core import pieces
from orchestration.core.db import session_scope
from orchestration.core.followups import Done
from orchestration.core.models import Step
from orchestration.core.settings import Settings
from orchestration.core.states import ParkReason, RunStatus
from orchestration.execution import Halt, Stepper, fence, parking, releasing
from orchestration.execution.rows import STARTABLE, Moved, lock
from orchestration.execution.starting import StartCall
from orchestration.providers.base import TurnRequest
from orchestration.runtime.executor import Executor
from tests.unit.support import (
    T0,
    force,
    force_step,
    launch,
    run_row,
    step_spec,
    steps_of,
    workflow,
)

#: The tick execution A holds (the fence it won moved ``polls`` to it).
TICK = 4


def _wait_for_a_lock_wait(settings: Settings) -> None:
    """Return once some backend on the test's database waits on a row lock."""
    waited = time.monotonic() + 10
    while not _waiting_on_a_lock(settings) and time.monotonic() < waited:
        time.sleep(0.02)
    assert _waiting_on_a_lock(settings), "the statement never waited on the held row"


def _waiting_on_a_lock(settings: Settings) -> bool:
    """Whether some backend on the test's database waits on a row lock."""
    with session_scope(settings.database_url) as session:
        waiting = session.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
        )
    return bool(waiting)


@pytest.mark.postgresql_only("row locks under READ COMMITTED are PostgreSQL's")
@pytest.mark.parametrize("run_status", [RunStatus.RUNNING, RunStatus.PARKED])
def test_a_park_waiting_on_a_takeover_fence_writes_nothing(
    settings: Settings, run_status: RunStatus
) -> None:
    """B fences the step (and stamps a running run) in a transaction; A's lock for its park
    waits on B's rows; B commits; A raises ``Moved`` and the step keeps B's fence, unparked.
    A running run makes A wait on the run row, a parked one on the step row."""
    run_id = launch(settings)
    force(
        settings,
        run_id,
        status=run_status.value,
        current_step=0,
        heartbeat_at=T0,
        parked_since=T0 if run_status is RunStatus.PARKED else None,
        park_reason="platform_interrupt" if run_status is RunStatus.PARKED else None,
    )
    step_status = "parked" if run_status is RunStatus.PARKED else "running"
    force_step(
        settings,
        run_id,
        0,
        status=step_status,
        provider_run_id="turn-1",
        started_at=T0,
        polls=TICK,
    )
    now = T0 + timedelta(seconds=1)
    outcome: list[BaseException | None] = []

    def park_as_a() -> None:
        def write(session: Session) -> Done[None]:
            run, step = lock(session, run_id, 0, TICK, now, STARTABLE)
            parking.park(session, settings, run, step, ParkReason.HUMAN, now, prompt="a?")
            return Done(None)

        try:
            Executor(settings, None)(write)
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    with session_scope(settings.database_url) as b:
        bound = fence.params(settings, run_id, 0, TICK, now, "b", 2)
        fenced = pieces.send(b, fence.ENTER, bound)["fenced"]
        assert fenced is not None
        a = threading.Thread(target=park_as_a, daemon=True)
        a.start()
        _wait_for_a_lock_wait(settings)
    a.join(20)
    assert len(outcome) == 1 and isinstance(outcome[0], Moved), outcome
    step = steps_of(settings, run_id)[0]
    assert (step.polls, step.status, step.worker) == (TICK + 1, step_status, "b")
    assert step.prompt is None
    run = run_row(settings, run_id)
    assert run.park_reason != ParkReason.HUMAN.value


@pytest.mark.postgresql_only("row locks under READ COMMITTED are PostgreSQL's")
def test_a_stale_start_never_clears_a_claim_committed_while_it_waited(settings: Settings) -> None:
    """A stale start (its run moved on) reads the step still holding its own claim; a newer
    execution's claim is committed while the stale start's hand-off waits on the row. The
    hand-off writes nothing: the newer claim, and the turn it will record, stay its own."""
    run_id = launch(settings)
    key = f"{run_id}:s1:1"
    force_step(
        settings,
        run_id,
        0,
        status="running",
        idempotency_key=key,
        start_claimed_at=T0,
        polls=TICK + 1,
    )
    request = TurnRequest(key=key, run_id=run_id, step_id="s1", attempt=1, input="t", options={})
    stale = StartCall(request, "scripted", T0)
    newer = T0 + timedelta(seconds=9)
    raised: list[BaseException] = []

    def release() -> None:
        try:
            releasing.release_refused_start(
                settings,
                Executor(settings, None),
                T0 + timedelta(seconds=10),
                run_id,
                0,
                stale,
                "turn-1",
            )
        except BaseException as exc:
            raised.append(exc)

    with session_scope(settings.database_url) as newer_execution:
        newer_execution.execute(
            update(Step)
            .where(Step.run_id == run_id, Step.index == 0)
            .values(start_claimed_at=newer, polls=TICK + 2)
        )
        thread = threading.Thread(target=release, daemon=True)
        thread.start()
        _wait_for_a_lock_wait(settings)
    thread.join(20)
    assert not thread.is_alive() and raised == []
    step = steps_of(settings, run_id)[0]
    assert (step.start_claimed_at, step.provider_run_id) == (newer, None)


def _as(settings: Settings, app: str) -> Settings:
    """``settings`` on connections named ``app`` (the chaos journal's writer)."""
    url = settings.database_url
    joined = "&" if "?" in url else "?"
    return settings.model_copy(update={"database_url": f"{url}{joined}application_name={app}"})


@pytest.mark.postgresql_only("the chaos audit's journal is PostgreSQL triggers")
def test_the_audit_passes_a_hand_off_under_the_cut_workers_claim_and_counts_other_writes(
    settings: Settings,
) -> None:
    """The chaos audit's journal, on the statements the engine sends: the cut worker claims
    the start, another worker fences the step after the cut, the cut worker's stale start
    hands its turn to the step under its claim (passed), then writes the step otherwise
    (counted)."""
    from chaos.fencing import WRITE_JOURNAL, Cut, read_writes, writes_after_takeover
    from orchestration.runs.transitions import touch_step

    victim, other = _as(settings, "chaos-net"), _as(settings, "chaos-w1")
    with session_scope(settings.database_url) as session:
        session.connection().exec_driver_sql(WRITE_JOURNAL)
    try:
        run_id = launch(settings)
        key = f"{run_id}:s1:1"
        force_step(settings, run_id, 0, status="running", idempotency_key=key, polls=TICK)
        with session_scope(victim.database_url) as session:
            session.execute(update(Step).where(Step.run_id == run_id).values(start_claimed_at=T0))
        cut_at = time.time()
        with session_scope(other.database_url) as session:
            bound = fence.params(settings, run_id, 0, TICK, T0, "w1", 2)
            assert pieces.send(session, fence.ENTER, bound)["fenced"] is not None
        request = TurnRequest(
            key=key, run_id=run_id, step_id="s1", attempt=1, input="t", options={}
        )
        releasing.release_refused_start(
            victim, Executor(victim, None), T0, run_id, 0, StartCall(request, "scripted", T0), "t-1"
        )
        assert steps_of(settings, run_id)[0].provider_run_id == "t-1"
        with session_scope(victim.database_url) as session:
            touch_step(session, steps_of(settings, run_id)[0], T0, last_provider_status="late")
        with session_scope(settings.database_url) as session:
            found = writes_after_takeover(
                read_writes(session.connection()), [Cut("chaos-net", cut_at, (run_id,))]
            )
    finally:
        with session_scope(settings.database_url) as session:
            session.connection().exec_driver_sql(
                "DROP TRIGGER chaos_write_runs ON runs; DROP TRIGGER chaos_write_steps ON steps;"
                " DROP TRIGGER chaos_write_events ON run_events;"
                " DROP FUNCTION chaos_note_write(); DROP TABLE chaos_writes;"
            )
    assert len(found) == 1, found
    assert "chaos-net wrote steps" in found[0]


def test_a_hand_off_under_a_claim_the_cut_worker_never_wrote_is_counted() -> None:
    """Only the cut worker's own claim covers its hand-off: one it clears of another's is a
    write over the taking execution's."""
    from chaos.fencing import Cut, Written, writes_after_takeover

    def write(
        at: float, app: str, *, fence: bool, claim: float | None = None, handoff: bool = False
    ) -> Written:
        return Written("steps", "r1", fence, False, at, app, claim, handoff)

    cut = Cut("chaos-net", at=100.0, runs=("r1",))
    own = [write(99.0, "chaos-net", fence=True, claim=98.0)]
    taken = [write(101.0, "chaos-w1", fence=True)]
    handed = [write(102.0, "chaos-net", fence=False, claim=98.0, handoff=True)]
    assert writes_after_takeover({"r1": own + taken + handed}, [cut]) == []
    others = [write(101.5, "chaos-w1", fence=False, claim=101.5)]
    stray = [write(102.0, "chaos-net", fence=False, claim=101.5, handoff=True)]
    assert len(writes_after_takeover({"r1": own + taken + others + stray}, [cut])) == 1


@pytest.mark.postgresql_only("the entry's fence goes as a statement of its own on PostgreSQL")
def test_a_delivery_fenced_over_between_its_two_statements_writes_nothing_more(
    settings_factory: Callable[..., Settings],
) -> None:
    """The entry's fence commits alone; a start its owner's live-turn budget holds back goes
    on in a second transaction, which says so on the step. A newer delivery fences the step
    between the two: the first must halt there, not write over the newer one's step."""
    settings = settings_factory(max_live_turns_per_owner=1)
    holder = launch(settings, workflow(step_spec(with_={"states": [["running", 1000]]})))
    run_id = launch(settings, workflow(step_spec(with_={"states": [["completed"]]})))
    force(settings, holder, status=RunStatus.RUNNING.value, current_step=0, heartbeat_at=T0)
    force_step(settings, holder, 0, status="running", provider_run_id="turn-1", started_at=T0)
    executor = Executor(settings, None)

    def transact(work: Any, **options: Any) -> Any:
        if not options.get("autocommit"):
            # The newer delivery's fence, committed after the first's and before its rest.
            force_step(settings, run_id, 0, polls=2, last_provider_status="newer delivery")
        return executor(work, **options)

    outcome = Stepper(settings, transact).advance(run_id, 0, 0)
    assert outcome == Halt("duplicate or stale delivery")
    step = steps_of(settings, run_id)[0]
    assert (step.status, step.polls, step.last_provider_status) == (
        "pending",
        2,
        "newer delivery",
    )
