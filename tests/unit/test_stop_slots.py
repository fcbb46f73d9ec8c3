"""Each owner's share of the stop task (issue 30): one owner's backlog of provider cancels
holds at most ``ORCH_STOP_TURNS_PER_OWNER`` of them in flight, and another owner's stop goes
ahead meanwhile. Times are passed in: nothing sleeps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from orchestration.core.followups import Done
from orchestration.core.models import Step
from orchestration.core.settings import Settings
from orchestration.execution import Poll, Stepper
from orchestration.providers.scripted import ScriptedProvider
from orchestration.runs import stop_slots
from orchestration.runtime.executor import Executor
from orchestration.upkeep.sweeper import Sweeper
from tests.unit.support import T0, Clock, RecordingDispatcher, launch, s, step_spec, workflow

HOLD = 60.0


def _started(settings: Settings, owner: str) -> str:
    """A run of ``owner`` whose turn started at T0."""
    run_id = launch(
        settings, workflow(step_spec(with_={"states": [["running"]]})), owner=owner, now=T0
    )
    outcome = Stepper(settings, Executor(settings, None), clock=Clock(T0)).advance(run_id, 0, 0)
    assert isinstance(outcome, Poll), outcome
    return run_id


def _cancelled(settings: Settings, run_id: str) -> bool:
    [turn] = ScriptedProvider(settings).turns(f"{run_id}:")
    return turn["cancel_requested_at"] is not None


def _stop(settings: Settings, run_id: str) -> dict[str, Any]:
    def read(session: Any) -> Done[dict[str, Any]]:
        return Done(session.scalars(select(Step.turn_stop).where(Step.run_id == run_id)).one())

    return Executor(settings, None)(read)


def test_one_owners_stops_take_their_share_and_another_owners_stop_goes_ahead(
    settings_factory: Callable[..., Settings],
) -> None:
    settings = settings_factory(max_rearms=0, stop_turns_per_owner=2)
    busy = [_started(settings, "busy") for _ in range(3)]
    plain = _started(settings, "plain")
    dispatcher = RecordingDispatcher()
    now = T0 + s(settings.heartbeat_timeout + 1)
    assert Sweeper(settings, Executor(settings, dispatcher)).sweep(now)["interrupted"] == 4
    assert sorted(dispatcher.stops) == sorted((run_id, 0) for run_id in [*busy, plain])
    transact = Executor(settings, None)

    # Two of busy's cancels are in flight (hanging on their provider, say).
    def hold(run_id: str) -> int | None:
        return transact(
            lambda session: Done(
                stop_slots.take(session, settings, "busy", run_id, 0, now, hold=HOLD)
            )
        )

    assert [hold(run_id) for run_id in busy[:2]] == [0, 1]

    # Busy's third waits its turn: no provider call, no attempt spent.
    assert stop_slots.attempt(transact, settings, busy[2], 0, now, hold=HOLD) == stop_slots.WAIT
    assert not _cancelled(settings, busy[2])
    assert _stop(settings, busy[2])["attempts"] == 0
    # Plain's goes ahead, and frees its slot.
    assert stop_slots.attempt(transact, settings, plain, 0, now, hold=HOLD) is None
    assert _cancelled(settings, plain) and _stop(settings, plain)["status"] == "stopped"

    transact(lambda session: stop_slots.release(session, "busy", 0, busy[0], 0))
    assert stop_slots.attempt(transact, settings, busy[2], 0, now, hold=HOLD) is None
    assert _cancelled(settings, busy[2])


def test_a_slot_whose_holder_died_is_free_after_the_hold(settings: Settings) -> None:
    transact = Executor(settings, None)

    def take(run_id: str, at: Any, owner: str = "o") -> int | None:
        return transact(
            lambda session: Done(
                stop_slots.take(session, settings, owner, run_id, 0, at, hold=HOLD)
            )
        )

    taken = [take(f"r{index}", T0) for index in range(settings.stop_turns_per_owner)]
    assert taken == list(range(settings.stop_turns_per_owner))
    assert take("late", T0 + s(HOLD)) is None
    assert take("late", T0 + s(HOLD + 1)) == 0
    assert take("another-owners", T0, owner="p") == 0
