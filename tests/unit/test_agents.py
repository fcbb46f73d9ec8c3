"""The operator's agent registry (issue 32): steps name agents (``agent: NAME``) whose entry
supplies the provider, the URL and the secret; raw URLs only where the operator allows them;
each step keeps its agent's evidence, and a pinned step whose agent changed fails
``agent_changed`` without starting a turn."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import ValidationError
from orchestration.core.followups import Done
from orchestration.core.settings import Settings
from orchestration.execution import Halt, Stepper
from orchestration.providers import evidence
from orchestration.providers.scripted import ScriptedProvider
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.workflows import agents, decoded
from tests.unit.support import (
    T0,
    Clock,
    RecordingDispatcher,
    counts,
    drive,
    force_step,
    launch,
    run_row,
    step_spec,
    steps_of,
    workflow,
)

#: An address nothing listens on (the discard port): a describe there fails at once.
AGENT_URL = "http://127.0.0.1:9/a2a"


@pytest.fixture
def strict(settings_factory: Callable[..., Settings]) -> Settings:
    """The defaults an operator gets: no raw URLs."""
    return settings_factory(allow_raw_urls=False)


def _register(settings: Settings, entry: agents.Entry) -> bool:
    executor = Executor(settings, None)
    return executor(lambda session: Done(agents.add(session, settings, entry, utcnow())))


def _agent_step(name: str = "research", **fields: Any) -> dict[str, Any]:
    return {"id": "ask", "agent": name, "task": "hello", **fields}


# --- registering -------------------------------------------------------------------------


def test_registering_checks_the_url_against_the_egress_rules(strict: Settings) -> None:
    with pytest.raises(ValidationError) as caught:
        _register(strict, agents.Entry("far", "a2a", "http://203.0.113.7/a2a"))
    assert caught.value.field == "url"
    assert "ORCH_PROVIDER_HOSTS" in caught.value.problem
    with pytest.raises(ValidationError) as caught:
        _register(strict, agents.Entry("meta", "a2a", "http://169.254.169.254/"))
    assert caught.value.field == "url"
    assert _listed(strict) == []


def _listed(settings: Settings) -> list[agents.Entry]:
    with session_scope(settings.database_url) as session:
        return agents.listing(session)


def test_registering_checks_the_secret_the_kind_and_the_name(strict: Settings) -> None:
    with pytest.raises(ValidationError) as caught:
        _register(strict, agents.Entry("x", "a2a", AGENT_URL, secret="AGENT_TOKEN"))
    assert (caught.value.field, "ORCH_PROVIDER_SECRETS" in caught.value.problem) == (
        "secret",
        True,
    )
    with pytest.raises(ValidationError, match="a2a, mcp, langgraph, http") as caught:
        _register(strict, agents.Entry("x", "scripted", AGENT_URL))
    assert caught.value.field == "provider"
    with pytest.raises(ValidationError) as caught:
        _register(strict, agents.Entry("no spaces", "a2a", AGENT_URL))
    assert caught.value.field == "name"
    assert _listed(strict) == []


def test_an_entry_is_added_replaced_listed_and_removed(strict: Settings) -> None:
    assert _register(strict, agents.Entry("research", "a2a", AGENT_URL)) is True
    assert _register(strict, agents.Entry("research", "a2a", AGENT_URL, pin=True)) is False
    assert [(e.name, e.pin) for e in _listed(strict)] == [("research", True)]
    executor = Executor(strict, None)
    assert executor(lambda session: Done(agents.remove(session, "research"))) is True
    assert executor(lambda session: Done(agents.remove(session, "research"))) is False


# --- naming agents in workflows ----------------------------------------------------------


def test_a_raw_url_is_refused_unless_the_operator_allows_it(
    strict: Settings, settings: Settings
) -> None:
    raw = {"id": "ask", "provider": "a2a", "task": "t", "with": {"url": AGENT_URL}}
    with pytest.raises(ValidationError) as caught:
        launch(strict, workflow(raw))
    assert caught.value.field == "steps[0].provider"
    assert "ORCH_ALLOW_RAW_URLS" in caught.value.problem
    assert counts(strict)["runs"] == 0
    launch(strict, workflow(step_spec("a")))  # the scripted provider calls nothing: allowed
    assert settings.allow_raw_urls  # the suite's settings allow them
    launch(settings, workflow(raw))


def test_an_unknown_agent_is_refused_naming_the_step_and_the_agent(strict: Settings) -> None:
    with pytest.raises(ValidationError) as caught:
        launch(strict, workflow(_agent_step("nobody")))
    assert caught.value.field == "steps[0].agent"
    assert "'ask'" in caught.value.problem and "'nobody'" in caught.value.problem
    assert counts(strict)["runs"] == 0
    assert counts(strict)["steps"] == 0


def test_a_step_may_add_options_but_never_the_url_or_secret(strict: Settings) -> None:
    _register(strict, agents.Entry("research", "a2a", AGENT_URL))
    for key in ("url", "headers"):
        with pytest.raises(ValidationError) as caught:
            launch(strict, workflow(_agent_step(**{"with": {key: "http://127.0.0.1:8/"}})))
        assert caught.value.field == f"steps[0].with.{key}"
    with pytest.raises(ValidationError) as caught:
        launch(strict, workflow(_agent_step(provider="http")))
    assert caught.value.field == "steps[0].provider"
    assert counts(strict)["runs"] == 0


def test_the_entry_supplies_provider_url_and_secret_and_the_owner_never_sees_them(
    strict: Settings,
) -> None:
    _register(strict, agents.Entry("research", "a2a", AGENT_URL, options={"skill": "echo"}))
    run_id = launch(strict, workflow(_agent_step(**{"with": {"skill": "summarise"}})))
    row = run_row(strict, run_id)
    assert row.workflow["steps"][0] == {
        **row.workflow["steps"][0],
        "agent": "research",
        "provider": "a2a",
        "with": {"skill": "summarise"},
    }
    assert steps_of(strict, run_id)[0].provider == "a2a"
    decoded._CACHE.clear()  # read back as a worker would: from the row
    with session_scope(strict.database_url) as session:
        spec = decoded.of_run(session, run_id)[0]
    assert (spec.provider, dict(spec.options)) == (
        "a2a",
        {"skill": "summarise", "url": AGENT_URL},
    )
    # The entry changes later: the run calls what it was launched with.
    _register(strict, agents.Entry("research", "a2a", "http://127.0.0.1:10/a2a"))
    decoded._CACHE.clear()
    with session_scope(strict.database_url) as session:
        assert decoded.of_run(session, run_id)[0].options["url"] == AGENT_URL
    record = Orchestrator(strict, RecordingDispatcher()).get(run_id, owner="owner-1")
    assert AGENT_URL not in json.dumps(record.workflow)


def test_an_http_agent_prefixes_its_request_paths_and_carries_its_secret() -> None:
    entry = agents.Entry("svc", "http", "http://127.0.0.1:8000/", secret="AGENT_TOKEN")
    merged = agents.options(entry, {"start": {"url": "/runs"}, "status_path": "s"})
    assert merged["start"]["url"] == "http://127.0.0.1:8000/runs"
    assert merged["headers"]["Authorization"] == {"secret": "AGENT_TOKEN", "prefix": "Bearer "}


def test_owners_list_the_names_only(strict: Settings) -> None:
    _register(strict, agents.Entry("research", "a2a", AGENT_URL))
    orch = Orchestrator(strict, RecordingDispatcher())
    with session_scope(strict.database_url) as session:
        token = tokens.create(session, "acme", "ci", now=utcnow())
    client = TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"})
    reply = client.get("/agents")
    assert reply.status_code == 200
    assert reply.json() == [{"name": "research", "provider": "a2a"}]
    assert TestClient(create_app(orch)).get("/agents").status_code == 401


# --- evidence and pinning ----------------------------------------------------------------


def test_an_unreachable_agent_is_recorded_at_launch_and_a_pinned_one_refused(
    strict: Settings,
) -> None:
    _register(strict, agents.Entry("research", "a2a", AGENT_URL))
    run_id = launch(strict, workflow(_agent_step()))
    seen = steps_of(strict, run_id)[0].evidence
    assert set(seen) == {"launch"} and "a2a agent card" in seen["launch"]["error"]
    with pytest.raises(ValidationError) as caught:
        launch(strict, workflow(_agent_step(pin=True)), request_id="pinned")
    assert caught.value.field == "steps[0].pin"
    assert "'ask' is pinned" in caught.value.problem


def _pinned(version: str, **fields: Any) -> dict[str, Any]:
    said = {"name": "sim", "version": version}
    return step_spec("a", pin=True, with_={"states": [["completed"]], "evidence": said}, **fields)


def test_a_pinned_step_on_the_same_version_runs_and_keeps_both_evidences(
    settings: Settings,
) -> None:
    run_id = launch(settings, workflow(_pinned("1.0")))
    stepper = Stepper(settings, Executor(settings, None), clock=Clock(T0), worker="u", pid=1)
    drive(stepper, run_id)
    step = steps_of(settings, run_id)[0]
    assert step.status == "completed"
    assert {key: step.evidence[key]["version"] for key in step.evidence} == {
        "launch": "1.0",
        "start": "1.0",
    }
    record = Orchestrator(settings, RecordingDispatcher()).get(run_id, owner="owner-1")
    assert record.steps[0].evidence == step.evidence


def test_a_pinned_step_whose_agent_changed_fails_agent_changed_and_starts_no_turn(
    settings: Settings,
) -> None:
    run_id = launch(settings, workflow(_pinned("2.0")))
    # At launch the agent said 1.0 (the row as the launch kept it); at the start it says 2.0.
    launched = {"launch": {"name": "sim", "version": "1.0", "detail": {}, "at": T0.isoformat()}}
    force_step(settings, run_id, 0, evidence=launched)
    stepper = Stepper(settings, Executor(settings, None), clock=Clock(T0), worker="u", pid=1)
    outcomes = drive(stepper, run_id)
    assert isinstance(outcomes[-1], Halt)
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("failed", "agent_changed")
    assert "'1.0' at launch" in (run.error or "") and "'2.0' at the step's start" in run.error
    step = steps_of(settings, run_id)[0]
    assert (step.status, step.provider_run_id) == ("failed", None)
    assert step.evidence["start"]["version"] == "2.0"
    assert ScriptedProvider(settings).start_calls(run_id) == []


def test_an_unpinned_step_runs_on_whatever_version_and_says_which(settings: Settings) -> None:
    said = {"name": "sim", "version": "3.1"}
    options = {"states": [["completed"]], "evidence": said}
    run_id = launch(settings, workflow(step_spec("a", with_=options)))
    stepper = Stepper(settings, Executor(settings, None), clock=Clock(T0), worker="u", pid=1)
    drive(stepper, run_id)
    step = steps_of(settings, run_id)[0]
    assert step.evidence["start"]["version"] == "3.1"
    assert "launch" not in step.evidence  # not pinned, no agent: asked at its start only


def test_the_comparison_names_both_versions() -> None:
    launch_seen = {"name": "a", "version": "1"}
    assert evidence.changed(launch_seen, {"name": "a", "version": "1"}) is None
    said = evidence.changed(launch_seen, {"name": "a", "version": "2"})
    assert said is not None and "'1' at launch" in said and "'2' at the step's start" in said
    assert evidence.changed({"error": "down"}, {"version": "2"}) is None
    assert json.dumps(said)


def test_explain_and_the_dashboard_say_what_each_step_ran_on(settings: Settings) -> None:
    clock = Clock(T0)
    run_id = launch(settings, workflow(_pinned("1.0")))
    drive(Stepper(settings, Executor(settings, None), clock=clock, worker="u", pid=1), run_id)
    orch = Orchestrator(settings, RecordingDispatcher(), clock=clock)
    told = orch.explain(run_id, owner="owner-1")
    assert told["ran_on"]["a"]["start"]["version"] == "1.0"
    assert "step 'a' at launch ran on 'sim' 1.0, at start ran on 'sim' 1.0" in told["text"]
    with session_scope(settings.database_url) as session:
        token = tokens.create(session, "owner-1", "t", now=clock.now)
    client = TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"})
    page = client.get(f"/dashboard/runs/{run_id}").text
    row = page[page.index('<tr class="evidence">') :]
    row = row[: row.index("</tr>")]
    assert "at launch:" in row and "at start:" in row
    assert row.count('<span class="mono">sim</span> 1.0') == 2


def test_a_pinned_branch_is_held_to_the_version_recorded_at_launch(settings: Settings) -> None:
    clock = Clock(T0)
    queue = RecordingDispatcher()
    fan = {"id": "fan", "for_each": [1, 2], "step": _pinned("2.0")}
    run_id = launch(settings, workflow(fan), dispatcher=queue)
    parent = steps_of(settings, run_id)[0]
    assert parent.evidence["branches"]["a"]["version"] == "2.0"
    # The launch recorded 1.0 (as if the agent changed since): every branch must refuse.
    said = {**parent.evidence["branches"]["a"], "version": "1.0"}
    force_step(settings, run_id, 0, evidence={"branches": {"a": said}})
    stepper = Stepper(settings, Executor(settings, queue), clock=clock, worker="u", pid=1)
    stepper.advance(run_id, 0, queue.chains[0].links[0].tick, chained=False)
    branches = [
        branch["run_id"]
        for branch in Orchestrator(settings, queue).get(run_id, owner="owner-1").steps[0].branches
        or []
    ]
    assert len(branches) == 2
    first = branches[0]
    assert steps_of(settings, first)[0].evidence["launch"]["version"] == "1.0"
    drive(stepper, first)
    ended = run_row(settings, first)
    assert (ended.status, ended.stop_reason) == ("failed", "agent_changed")
    assert ScriptedProvider(settings).start_calls(first) == []
