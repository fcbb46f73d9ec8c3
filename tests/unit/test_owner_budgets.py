"""Per-owner budgets (issue 30): each is refused at admission with an error naming the budget
and its setting, and an operator's own value for the owner (``owner_budgets``) replaces the
setting in the same statement."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import LimitExceeded
from orchestration.core.settings import Settings
from orchestration.execution import Poll
from orchestration.limits import owner_budgets
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from tests.unit.support import (
    T0,
    RecordingDispatcher,
    cli,
    insert_run,
    launch,
    step_spec,
    workflow,
)
from tests.unit.test_branches import OWNER, World, _research

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


def _flow(task: str) -> dict[str, object]:
    return workflow(step_spec(task=task), name="research")


def test_registering_past_the_owners_definitions_is_refused_naming_the_budget(
    settings_factory: Callable[..., Settings],
) -> None:
    settings = settings_factory(max_definitions_per_owner=2)
    orch = Orchestrator(settings, RecordingDispatcher())
    orch.register_workflow(_flow("one"), owner=OWNER)
    orch.register_workflow(_flow("two"), owner=OWNER)
    # The same content again is the version it already is: nothing new is stored.
    assert orch.register_workflow(_flow("one"), owner=OWNER)[1] is False
    with pytest.raises(LimitExceeded) as refused:
        orch.register_workflow(_flow("three"), owner=OWNER)
    assert refused.value.field == "definitions"
    assert refused.value.problem == (
        "owner 'owner-1' has 2 registered definition versions, the limit of 2 "
        "(ORCH_MAX_DEFINITIONS_PER_OWNER, or the owner's own --max-definitions); "
        "an operator may raise it"
    )
    assert [one.version for one in orch.workflows(owner=OWNER)] == [2, 1]
    # Another owner, and the operator's published definitions, have their own.
    orch.register_workflow(_flow("three"), owner="other")
    orch.register_workflow(_flow("three"), owner=OWNER, shared=True)


def test_an_owners_own_values_replace_the_settings_at_admission(
    settings: Settings, tmp_path: Path
) -> None:
    run = cli(settings)
    made = run("owners", "set", OWNER, "--max-active-runs", "1", "--max-definitions", "1")
    assert made.returncode == 0, made.stderr
    assert made.stdout == (
        f"owner {OWNER}: max_active_runs=1, max_live_turns=default, max_definitions=1, "
        "max_stored_bytes=default\n"
    )
    queue = RecordingDispatcher()
    launch(settings, workflow(step_spec()), dispatcher=queue)
    with pytest.raises(LimitExceeded, match=r"the limit of 1 \(ORCH_MAX_ACTIVE_RUNS_PER_OWNER, "):
        launch(settings, workflow(step_spec()), dispatcher=queue)
    # The setting (1000 here) still holds for every other owner.
    launch(settings, workflow(step_spec()), owner="other", dispatcher=queue)
    path = tmp_path / "flow.yaml"
    for task in ("one", "two"):
        path.write_text(yaml.safe_dump(_flow(task)))
        said = cli(settings, OWNER)("workflows", "register", str(path))
    assert said.returncode == 2
    assert "the limit of 1 (ORCH_MAX_DEFINITIONS_PER_OWNER" in said.stderr
    shown = json.loads(run("owners", "show", OWNER, "--json").stdout)["budgets"]
    assert [(b["budget"], b["used"], b["limit"], b["own"]) for b in shown] == [
        ("owner_runs", 1, 1, 1),
        ("owner_live_turns", 0, settings.max_live_turns_per_owner, None),
        ("owner_definitions", 1, 1, 1),
        ("owner_stored_bytes", 0, settings.max_stored_bytes_per_owner, None),
    ]
    # Raised past the setting, and put back to it.
    assert run("owners", "set", OWNER, "--max-active-runs", "2").returncode == 0
    launch(settings, workflow(step_spec()), dispatcher=queue)
    assert run("owners", "set", OWNER, "--max-definitions", "default").returncode == 0
    listed = json.loads(run("owners", "list", "--json").stdout)
    assert [(o["owner"], o["max_active_runs"], o["max_definitions"]) for o in listed] == [
        (OWNER, 2, None)
    ]
    assert "owner_runs" in run("owners", "show", OWNER).stdout


def test_owners_set_refuses_bad_values_naming_the_option(settings: Settings) -> None:
    run = cli(settings)
    for argv, named in (
        (["--max-active-runs", "lots"], "--max-active-runs"),
        (["--max-active-runs", "0"], "max_active_runs"),
        ([], "--max-active-runs"),
    ):
        said = run("owners", "set", OWNER, *argv)
        assert said.returncode == 2, said
        assert named in said.stderr
    assert run("owners", "set", "two words", "--max-active-runs", "1").returncode == 2
    assert json.loads(run("owners", "list", "--json").stdout) == []


def _answer() -> dict[str, object]:
    """A step that answers its task: ``args.text`` becomes its output."""
    return workflow(step_spec(task="{{ args.text }}", with_={"states": [["completed"]]}))


def test_stored_bytes_refuse_the_output_that_passes_them_and_then_launches(
    settings_factory: Callable[..., Settings],
) -> None:
    world = World(settings_factory(inline_output_bytes=1024, max_stored_bytes_per_owner=7000))
    first = world.launch(_answer(), {"text": "a" * 4000})
    world.pump()
    assert world.record(first).status == "completed"
    # The same bytes again are stored once: they cost nothing more.
    again = world.launch(_answer(), {"text": "a" * 4000})
    world.pump()
    assert world.record(again).status == "completed"
    over = world.launch(_answer(), {"text": "b" * 4000})
    world.pump()
    record = world.record(over)
    assert (record.status, record.stop_reason) == ("failed", "over_limit")
    assert record.steps[0].error == (
        "step a: the output is 4000 bytes and owner 'owner-1' has 4000 stored bytes (the "
        "outputs and artifacts of live and kept runs), the limit of 7000 "
        "(ORCH_MAX_STORED_BYTES_PER_OWNER, or the owner's own --max-stored-bytes); prune ended "
        "runs (orchestration prune) or ask an operator to raise it"
    )
    # An inline output fits, and counts: its JSON string is 102 bytes.
    small = world.launch(_answer(), {"text": "c" * 100})
    world.pump()
    assert world.record(small).status == "completed"
    # At the budget, a launch is refused; other owners are not held back.
    run = cli(world.settings)
    assert run("owners", "set", OWNER, "--max-stored-bytes", "4000").returncode == 0
    with pytest.raises(LimitExceeded, match=r"has 4102 stored bytes .* the limit of 4000 \("):
        world.launch(_answer(), {"text": "d"})
    launch(world.settings, _answer(), {"text": "d"}, owner="other")
    shown = json.loads(run("owners", "show", OWNER, "--json").stdout)["budgets"]
    assert ("owner_stored_bytes", 4102, 4000, 4000) in [
        (b["budget"], b["used"], b["limit"], b["own"]) for b in shown
    ]


def test_live_turns_refuse_a_launch_and_hold_a_start_until_a_turn_ends(
    settings_factory: Callable[..., Settings],
) -> None:
    world = World(settings_factory(max_live_turns_per_owner=1, max_live_turn_wait=30.0))
    first = world.launch(workflow(step_spec(with_=RUNNING)))
    second = world.launch(workflow(step_spec(with_={"states": [["completed"]]})))
    world.pump(rounds=2)
    # The first holds the owner's one turn; the second's start waits, saying why.
    assert world.record(first).steps[0].provider_run_id is not None
    held = world.record(second)
    assert (held.status, held.steps[0].status) == ("queued", "pending")
    explained = world.orch.explain(second, owner=OWNER)
    assert "waits for one of its owner's live provider turns to end" in explained["why"]
    assert "ORCH_MAX_LIVE_TURNS_PER_OWNER" in explained["why"]
    # A launch at the budget is refused, naming it; another owner is not held back.
    with pytest.raises(LimitExceeded, match=r"1 live provider turns, the limit of 1 \(ORCH_MAX_L"):
        world.launch(workflow(step_spec()))
    done = workflow(step_spec(with_={"states": [["completed"]]}))
    theirs = launch(
        world.settings, done, owner="other", now=world.clock.now, dispatcher=world.queue
    )
    world.pump(rounds=2)
    assert world.orch.get(theirs, owner="other").status == "completed"
    # The turn ends: the held start goes at its next look.
    world.orch.cancel(first, owner=OWNER)
    world.pump()
    assert world.record(second).status == "completed"


def test_a_held_start_is_judged_again_at_every_look_an_approvals_included(
    settings_factory: Callable[..., Settings],
) -> None:
    # A look after the first is a poll's entry (sent with no transaction on PostgreSQL), which
    # leaves the refusal to the transaction that goes on with a start: an approval, which
    # claims no turn, is held there too, not asked.
    world = World(settings_factory(max_live_turns_per_owner=1, max_live_turn_wait=30.0))
    first = world.launch(workflow(step_spec(with_=RUNNING)))
    asking = world.launch(
        {
            "name": "ask",
            "steps": [{"id": "review", "approval": {"prompt": "Go?", "expires_in": 600}}],
        }
    )
    world.pump(rounds=4)
    held = world.record(asking)
    assert (held.status, held.steps[0].status) == ("queued", "pending")
    looks = [outcome for run_id, outcome in world.played if run_id == asking]
    assert [(type(look), getattr(look, "tick", None)) for look in looks] == [
        (Poll, tick) for tick in (1, 2, 3, 4)
    ]
    world.orch.cancel(first, owner=OWNER)
    world.pump(rounds=2)
    asked = world.record(asking)
    assert (asked.status, asked.park_reason, asked.steps[0].status) == (
        "parked",
        "approval",
        "parked",
    )


def test_a_start_held_past_the_wait_fails_its_run_naming_the_budget(
    settings_factory: Callable[..., Settings],
) -> None:
    world = World(settings_factory(max_live_turns_per_owner=1, max_live_turn_wait=2.0))
    world.launch(workflow(step_spec(with_=RUNNING)))
    second = world.launch(workflow(step_spec()))
    world.pump(rounds=30)
    record = world.record(second)
    assert (record.status, record.stop_reason) == ("failed", "over_limit")
    assert record.error == (
        "step a waited 2 s (ORCH_MAX_LIVE_TURN_WAIT) for a turn: owner 'owner-1' has 1 live "
        "provider turns, the limit of 1 (ORCH_MAX_LIVE_TURNS_PER_OWNER, or the owner's own "
        "--max-live-turns); retry when some end"
    )


def test_metrics_and_the_fleet_page_show_the_busiest_owners_use_of_their_budgets(
    settings_factory: Callable[..., Settings],
) -> None:
    settings = settings_factory(metrics_top_owners=2, max_active_runs_per_owner=5)
    for owner, runs in (("busy", 3), ("middling", 2), ("quiet", 1)):
        for _ in range(runs):
            insert_run(settings, "running", owner=owner)
    with session_scope(settings.database_url) as session:
        owner_budgets.set_own(session, "busy", {"max_active_runs": 4}, T0)
        operator = tokens.create(session, None, "alice", now=utcnow(), operator=True)
    app = create_app(Orchestrator(settings, None))
    scraped = TestClient(app).get("/metrics").text
    used = re.findall(r"orchestration_owner_budget_used\{(.*?)\} (\S+)", scraped)
    # Two owners (the setting), four budgets each: the quiet owner is not a label.
    assert len(used) == 8 and "quiet" not in scraped
    assert 'orchestration_owner_budget_used{budget="owner_runs",owner="busy"} 3.0' in scraped
    assert 'orchestration_owner_budget_limit{budget="owner_runs",owner="busy"} 4.0' in scraped
    assert 'orchestration_owner_budget_limit{budget="owner_runs",owner="middling"} 5.0' in scraped
    page = TestClient(app, headers={"Authorization": f"Bearer {operator}"}).get("/dashboard/fleet")
    rows = re.findall(r'<tr data-owner="([^"]+)">(.*?)</tr>', page.text, re.S)
    assert [owner for owner, _ in rows] == ["busy", "middling"]
    busy = rows[0][1]
    assert re.search(r'data-budget="owner_runs"[^>]*>3 / 4 <span class="muted">own</span>', busy)


def test_the_http_api_refuses_over_a_budget_naming_it(settings: Settings) -> None:
    with session_scope(settings.database_url) as session:
        owner_budgets.set_own(session, OWNER, {"max_active_runs": 1, "max_definitions": 1}, T0)
        token = tokens.create(session, OWNER, "t", now=utcnow())
    client = TestClient(
        create_app(Orchestrator(settings, RecordingDispatcher())),
        headers={"Authorization": f"Bearer {token}"},
    )
    assert client.post("/workflows", json=_flow("one")).status_code == 201
    refused = client.post("/workflows", json=_flow("two"))
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "definitions"
    assert "ORCH_MAX_DEFINITIONS_PER_OWNER" in refused.json()["error"]["message"]
    assert client.post("/runs", json={"workflow": _flow("one")}).status_code == 201
    over = client.post("/runs", json={"workflow": _flow("one")})
    assert (over.status_code, over.json()["error"]["field"]) == (422, "runs")
    assert "ORCH_MAX_ACTIVE_RUNS_PER_OWNER" in over.json()["error"]["message"]
