"""A cancel names only its owner's run (invariant 7): another owner's run, live or ended, a
missing id and an id that cannot be one are all "not found", and nothing is written, revoked
or stopped. The owner is checked on the row the cancel request locks: another owner's request
is rolled back, so a cancel needs no read of its own before it."""

from __future__ import annotations

from typing import Any

import pytest

from orchestration.core.errors import RunNotFound
from orchestration.core.settings import Settings
from tests.unit.support import snapshot, step_spec, workflow
from tests.unit.test_branches import OWNER, World

RUNNING = {"states": [["running"]]}


def _sent(world: World) -> tuple[Any, ...]:
    return (list(world.queue.revoked), list(world.queue.stops))


@pytest.mark.parametrize("graceful", [False, True])
def test_another_owners_live_run_is_not_found_and_nothing_is_written(
    settings: Settings, graceful: bool
) -> None:
    world = World(settings)
    run_id = world.launch(workflow(step_spec(with_=RUNNING)))
    world.pump(rounds=3)
    assert world.record(run_id).status == "running"
    before, sent = snapshot(settings, run_id), _sent(world)
    with pytest.raises(RunNotFound) as raised:
        world.orch.cancel(run_id, owner="someone-else", graceful=graceful)
    assert str(raised.value) == f"no run {run_id!r} for this owner"
    assert snapshot(settings, run_id) == before
    assert _sent(world) == sent
    # The owner's own cancel is untouched by the refused one.
    assert world.orch.cancel(run_id, owner=OWNER).status == "cancelled"


def test_another_owners_ended_run_a_missing_id_and_a_bad_id_are_not_found(
    settings: Settings,
) -> None:
    world = World(settings)
    run_id = world.launch(workflow(step_spec(with_=RUNNING)))
    world.pump(rounds=3)
    world.orch.cancel(run_id, owner=OWNER)
    before, sent = snapshot(settings, run_id), _sent(world)
    for named, owner in (
        (run_id, "someone-else"),
        ("no-such-run", OWNER),
        ("x" * 65, OWNER),
        (42, OWNER),
    ):
        with pytest.raises(RunNotFound):
            world.orch.cancel(named, owner=owner)  # type: ignore[arg-type]
    assert snapshot(settings, run_id) == before
    assert _sent(world) == sent
    assert world.orch.cancel_run(run_id, owner=OWNER).changed is False
