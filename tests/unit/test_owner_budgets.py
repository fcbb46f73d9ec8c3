"""Per-owner budgets (issue 30): each is refused at admission with an error naming the budget
and its setting, and an operator's own value for the owner (``owner_budgets``) replaces the
setting in the same statement."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orchestration.core.errors import LimitExceeded
from orchestration.core.settings import Settings
from tests.unit.support import launch, step_spec, workflow
from tests.unit.test_branches import World, _research

RUNNING = {"states": [["running"]]}


def test_branch_runs_count_toward_the_owners_active_runs(
    settings_factory: Callable[..., Settings],
) -> None:
    settings: Settings = settings_factory(max_active_runs_per_owner=4)
    world = World(settings)
    flow = _research()
    flow["steps"][0]["step"]["with"] = RUNNING
    world.launch(flow, {"topics": ["a", "b", "c"]})
    world.pump(rounds=2)
    # The parent and its three branch runs are the owner's four.
    with pytest.raises(LimitExceeded, match=r"4 active runs .*ORCH_MAX_ACTIVE_RUNS_PER_OWNER"):
        world.launch(workflow(step_spec()))
    # Another owner is not held back by them.
    launch(settings, workflow(step_spec()), owner="other")


def test_a_for_each_over_the_owners_budget_fails_its_run_naming_the_budget(
    settings_factory: Callable[..., Settings],
) -> None:
    settings: Settings = settings_factory(max_active_runs_per_owner=3)
    world = World(settings)
    run_id = world.launch(_research(), {"topics": ["a", "b", "c"]})
    world.pump()
    record = world.record(run_id)
    # Refused, not held: the run ends at once, and no branch run was written.
    assert (record.status, record.stop_reason) == ("failed", "over_limit")
    assert not record.steps[0].branches
    assert record.error == (
        "step research: its 3 branch runs do not fit: owner 'owner-1' has 1 active runs "
        "(branch runs included), the limit of 3 (ORCH_MAX_ACTIVE_RUNS_PER_OWNER, or the "
        "owner's own --max-active-runs); retry when some end"
    )
    # Within the budget it runs.
    done = world.launch(_research(), {"topics": ["a", "b"]})
    world.pump()
    assert world.record(done).status == "completed"
