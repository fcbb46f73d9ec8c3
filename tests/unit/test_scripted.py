"""The scripted provider on a SQLite file: idempotent starts, scripted states over time,
tombstoning cancels, option validation and checkpoint failures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from orchestration import providers
from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import RetryableProviderError, ValidationError
from orchestration.core.settings import Settings
from orchestration.providers.base import Provider, ProviderStatus, TurnRef, TurnRequest
from orchestration.providers.scripted import (
    EXISTING,
    EXPIRED,
    STARTED,
    TOMBSTONE,
    TURNS,
    ScriptedProvider,
    store_url,
)
from tests.conftest import wait_for
from tests.unit.support import make_settings


@pytest.fixture
def scripted(settings: Settings) -> Settings:
    return settings


@pytest.fixture
def provider(scripted: Settings) -> ScriptedProvider:
    return ScriptedProvider(scripted)


def _request(key: str = "run:a:1", **options: Any) -> TurnRequest:
    return TurnRequest(
        key=key,
        run_id=key.split(":")[0],
        step_id="a",
        attempt=1,
        input={"question": "q"},
        options=options,
    )


def _ref(request: TurnRequest, provider_run_id: str | None = None) -> TurnRef:
    return TurnRef(request.key, provider_run_id, request.options)


def _age(settings: Settings, key: str, seconds: float, column: str = "started_at") -> None:
    """Move a turn's clock back: the turn behaves as if it started ``seconds`` earlier."""
    with session_scope(store_url(settings)) as session:
        when = session.execute(
            select(getattr(TURNS.c, column)).where(TURNS.c.key == key)
        ).scalar_one()
        session.execute(
            update(TURNS)
            .where(TURNS.c.key == key)
            .values({column: when - timedelta(seconds=seconds)})
        )


def test_the_scripted_provider_keeps_the_provider_protocol(provider: ScriptedProvider) -> None:
    assert isinstance(provider, Provider)
    assert "scripted" in providers.names()


def test_start_is_idempotent_per_key(provider: ScriptedProvider) -> None:
    request = _request()
    first = provider.start(request)
    assert provider.start(request) == first
    assert provider.start(_request(states=[["failed"]])) == first  # same key, other options
    [turn] = provider.turns("run:")
    assert (turn["key"], turn["provider_run_id"], turn["start_calls"]) == ("run:a:1", first, 3)
    assert turn["options"] == {}  # the first start's turn stands
    other = provider.start(_request("run:a:2"))
    assert other != first
    assert len(provider.turns("run:")) == 2


def test_every_start_call_is_journaled_with_what_it_did(provider: ScriptedProvider) -> None:
    # A second start of the same key begins no second turn, so the turn row cannot show it;
    # the journal must, with the call's own time.
    before = utcnow()
    provider.start(_request())
    provider.start(_request())
    provider.start(_request("run:b:1"))
    calls = provider.start_calls("run:a:")
    assert [(c["key"], c["outcome"]) for c in calls] == [
        ("run:a:1", STARTED),
        ("run:a:1", EXISTING),
    ]
    assert before <= calls[0]["called_at"] <= calls[1]["called_at"] <= utcnow()
    [turn] = provider.turns("run:a:")
    assert turn["started_at"] == calls[0]["called_at"]  # the call that began the turn
    assert [c["key"] for c in provider.start_calls("run:")] == ["run:a:1", "run:a:1", "run:b:1"]


def test_turns_filters_by_a_literal_prefix(provider: ScriptedProvider) -> None:
    provider.start(_request("r_1:a:1"))
    provider.start(_request("rx1:a:1"))
    assert [turn["key"] for turn in provider.turns("r_1:")] == ["r_1:a:1"]


def test_states_play_over_time_and_the_last_is_held(
    provider: ScriptedProvider, scripted: Settings
) -> None:
    request = _request(states=[["pending", 10], ["running", 20], ["completed"]], output="done")
    provider.start(request)
    ref = _ref(request)
    assert provider.status(ref).status is ProviderStatus.PENDING
    _age(scripted, request.key, 15)
    assert provider.status(ref).status is ProviderStatus.RUNNING
    _age(scripted, request.key, 20)
    finished = provider.status(ref)
    assert (finished.status, finished.raw, finished.output) == (
        ProviderStatus.COMPLETED,
        "completed",
        "done",
    )
    _age(scripted, request.key, 10**6)
    assert provider.status(ref).status is ProviderStatus.COMPLETED


def test_a_short_script_finishes_in_real_time(provider: ScriptedProvider) -> None:
    request = _request(states=[["running", 0.5], ["idle"]])
    provider.start(request)
    assert provider.status(_ref(request)).status is ProviderStatus.RUNNING
    finished = wait_for(
        lambda: (
            (observed := provider.status(_ref(request))).status is ProviderStatus.IDLE and observed
        ),
        timeout=5,
        what="the scripted turn to go idle",
    )
    assert finished.output == {"question": "q"}  # no output option: the rendered input


def test_a_failed_turn_reports_its_error(provider: ScriptedProvider) -> None:
    request = _request(states=[["failed"]], error="model overloaded")
    provider.start(request)
    observed = provider.status(_ref(request))
    assert (observed.status, observed.error) == (ProviderStatus.FAILED, "model overloaded")


def test_input_required_reports_its_prompt(provider: ScriptedProvider) -> None:
    request = _request(states=[["input_required"]], prompt={"ask": "which one?"})
    provider.start(request)
    observed = provider.status(_ref(request))
    assert (observed.status, observed.prompt) == (
        ProviderStatus.INPUT_REQUIRED,
        {"ask": "which one?"},
    )


def test_rate_limited_reports_when_it_resets(
    provider: ScriptedProvider, scripted: Settings
) -> None:
    request = _request(states=[["running", 5], ["rate_limited", 30], ["completed"]])
    provider.start(request)
    _age(scripted, request.key, 10)
    [turn] = provider.turns("run:")
    observed = provider.status(_ref(request))
    assert observed.status is ProviderStatus.RATE_LIMITED
    assert observed.reset_at == turn["started_at"] + timedelta(seconds=5 + 30)


def test_reset_after_overrides_the_rate_limit_duration(provider: ScriptedProvider) -> None:
    request = _request(states=[["rate_limited", 30], ["completed"]], reset_after=7)
    provider.start(request)
    [turn] = provider.turns("run:")
    observed = provider.status(_ref(request))
    assert observed.reset_at == turn["started_at"] + timedelta(seconds=7)


def test_a_resumed_turn_plays_the_resume_script(
    provider: ScriptedProvider, scripted: Settings
) -> None:
    options = {"states": [["input_required"]], "resume_states": [["running", 10], ["completed"]]}
    request = TurnRequest(
        key="run:a:2",
        run_id="run",
        step_id="a",
        attempt=2,
        input="q",
        options=options,
        resume={"answer": 42},
        resuming=True,
    )
    provider.start(request)
    assert provider.status(_ref(request)).status is ProviderStatus.RUNNING
    _age(scripted, request.key, 11)
    observed = provider.status(_ref(request))
    assert (observed.status, observed.output) == (ProviderStatus.COMPLETED, {"answer": 42})


def test_an_unknown_turn_is_pending(provider: ScriptedProvider) -> None:
    assert provider.status(TurnRef("never:a:1", None, {})).status is ProviderStatus.PENDING


def test_cancel_lands_after_its_delay(provider: ScriptedProvider, scripted: Settings) -> None:
    request = _request(states=[["running"]], cancel_delay=30)
    provider.start(request)
    provider.cancel(_ref(request))
    assert provider.status(_ref(request)).status is ProviderStatus.RUNNING
    _age(scripted, request.key, 31, column="cancel_requested_at")
    assert provider.status(_ref(request)).status is ProviderStatus.CANCELLED


def test_cancel_is_idempotent(provider: ScriptedProvider) -> None:
    request = _request(states=[["running"]])
    provider.start(request)
    provider.cancel(_ref(request))
    [first] = provider.turns("run:")
    provider.cancel(_ref(request))
    [second] = provider.turns("run:")
    assert first["cancel_requested_at"] == second["cancel_requested_at"] is not None
    assert provider.status(_ref(request)).status is ProviderStatus.CANCELLED


@pytest.mark.parametrize(
    ("end", "delay"),
    [("completed", 0), ("failed", 0), ("idle", 0), ("completed", 30)],
)
def test_a_cancel_that_lands_after_the_turn_ended_keeps_its_end(
    provider: ScriptedProvider, scripted: Settings, end: str, delay: float
) -> None:
    request = _request(states=[["running", 40], [end]], cancel_delay=delay)
    provider.start(request)
    _age(scripted, request.key, 41 - delay)  # it ends 1 s before the cancel lands
    provider.cancel(_ref(request))
    provider.cancel(_ref(request))
    for column in ("started_at", "cancel_requested_at"):  # the cancel has landed
        _age(scripted, request.key, delay + 1, column=column)
    assert provider.status(_ref(request)).status == end


def test_a_cancel_that_lands_before_the_turn_ends_stops_it(
    provider: ScriptedProvider, scripted: Settings
) -> None:
    request = _request(states=[["running", 10], ["completed"]], cancel_delay=5)
    provider.start(request)
    _age(scripted, request.key, 4)  # the cancel lands at 9 s, the turn would end at 10 s
    provider.cancel(_ref(request))
    for column in ("started_at", "cancel_requested_at"):  # both have passed
        _age(scripted, request.key, 20, column=column)
    assert provider.status(_ref(request)).status is ProviderStatus.CANCELLED


def test_a_cancel_before_the_start_tombstones_the_key(provider: ScriptedProvider) -> None:
    request = _request(states=[["running", 1], ["completed"]], cancel_delay=60)
    provider.cancel(_ref(request))
    [tombstone] = provider.turns("run:")
    assert (tombstone["started_at"], tombstone["start_calls"]) == (None, 0)
    provider.start(request)  # a start that lost the race with the cancel
    [turn] = provider.turns("run:")
    assert turn["started_at"] is None, "a tombstoned key must not begin a turn"
    assert turn["start_calls"] == 1
    assert provider.status(_ref(request)).status is ProviderStatus.CANCELLED
    [call] = provider.start_calls("run:")
    assert (call["key"], call["outcome"]) == (request.key, TOMBSTONE)
    assert call["called_at"] > turn["cancel_requested_at"]


def test_a_start_after_the_cancel_of_a_started_turn_is_journaled(
    provider: ScriptedProvider,
) -> None:
    request = _request(states=[["running"]])
    provider.start(request)
    provider.cancel(_ref(request))
    provider.start(request)
    [turn] = provider.turns("run:")
    first, late = provider.start_calls("run:")
    assert (first["outcome"], late["outcome"]) == (STARTED, EXISTING)
    assert first["called_at"] < turn["cancel_requested_at"] < late["called_at"]


def test_a_start_that_arrives_after_its_deadline_begins_nothing(
    provider: ScriptedProvider,
) -> None:
    """A request delayed past its deadline (finding 8: a start stuck in the network until
    after the cancel's claim window) is refused and journaled; the engine's next claim,
    with a new deadline, begins the turn."""
    late = replace(_request(states=[["running"]]), deadline=utcnow() - timedelta(seconds=1))
    with pytest.raises(RetryableProviderError, match="after its deadline; no turn began"):
        provider.start(late)
    assert provider.turns("run:") == []
    fresh = replace(late, deadline=utcnow() + timedelta(seconds=30))
    provider.start(fresh)
    assert [call["outcome"] for call in provider.start_calls("run:")] == [EXPIRED, STARTED]
    [turn] = provider.turns("run:")
    assert turn["started_at"] <= fresh.deadline


def test_a_late_start_after_a_cancel_expires_before_it_meets_the_tombstone(
    provider: ScriptedProvider,
) -> None:
    request = _request(states=[["running"]])
    provider.cancel(_ref(request))
    with pytest.raises(RetryableProviderError, match="after its deadline"):
        provider.start(replace(request, deadline=utcnow() - timedelta(seconds=1)))
    [call] = provider.start_calls("run:")
    assert call["outcome"] == EXPIRED
    [tombstone] = provider.turns("run:")
    assert tombstone["start_calls"] == 0


def test_start_calls_filters_by_a_literal_prefix(provider: ScriptedProvider) -> None:
    provider.start(_request("r_1:a:1"))
    provider.start(_request("rx1:a:1"))
    assert [call["key"] for call in provider.start_calls("r_1:")] == ["r_1:a:1"]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"bogus": 1}, "bogus"),
        ({"states": []}, "states"),
        ({"states": "running"}, "states"),
        ({"states": [["running", 1, 2]]}, "states[0]"),
        ({"states": ["running"]}, "states[0]"),
        ({"states": [["thinking"]]}, "states[0]"),
        ({"states": [["running"], ["completed"]]}, "states[0]"),
        ({"resume_states": [["completed", 1], ["nope"]]}, "resume_states[1]"),
        ({"reset_after": -1}, "reset_after"),
        ({"cancel_delay": "soon"}, "cancel_delay"),
        ({"poll_delay": True}, "poll_delay"),
        ({"error": {"text": "x"}}, "error"),
        ({"checkpoint_fails": "yes"}, "checkpoint_fails"),
    ],
)
def test_validate_rejects_bad_options_naming_the_field(
    provider: ScriptedProvider, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        provider.validate(options)
    assert caught.value.field == field
    assert caught.value.problem


def test_validate_accepts_every_documented_option(provider: ScriptedProvider) -> None:
    provider.validate(
        {
            "states": [["pending", 0.1], ["running", 1], ["rate_limited", 2], ["completed"]],
            "output": {"any": ["json"]},
            "error": "text",
            "prompt": "why?",
            "reset_after": 0,
            "cancel_delay": 1.5,
            "resume_states": [["completed"]],
            "resume_output": None,
            "poll_delay": 0,
            "checkpoint_fails": False,
        }
    )


def test_checkpoint_fails_makes_the_snapshot_retryable(provider: ScriptedProvider) -> None:
    failing = _request(checkpoint_fails=True)
    provider.start(failing)
    with pytest.raises(RetryableProviderError, match="checkpoint_fails"):
        provider.snapshot(_ref(failing))
    working = _request("run:b:1", states=[["completed"]], output=[1, 2])
    provider.start(working)
    assert provider.snapshot(_ref(working)) == {"status": "completed", "output": [1, 2]}


def test_a_poll_slower_than_the_provider_timeout_is_an_outage(
    settings_factory: Callable[..., Settings],
) -> None:
    quick = ScriptedProvider(settings_factory(provider_timeout=0.05))
    request = _request(poll_delay=5)
    quick.start(request)
    started = utcnow()
    with pytest.raises(RetryableProviderError, match="timed out"):
        quick.status(_ref(request))
    assert (utcnow() - started).total_seconds() < 2, "the call is bounded by provider_timeout"


def test_turns_are_stored_beside_the_database_by_default(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, scripted_url=None)
    assert store_url(settings) == f"sqlite:///{tmp_path / 't.scripted.db'}"
    postgres = Settings(database_url="postgresql://u:p@db/orch")
    assert store_url(postgres) == postgres.database_url
    assert postgres.database_url.startswith("postgresql://u:p@db/orch?options=")
    explicit = make_settings(tmp_path, scripted_url="sqlite:///elsewhere.db")
    assert store_url(explicit) == "sqlite:///elsewhere.db"


# -- bugs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [["running"], {"s": "running"}])
def test_an_unhashable_status_is_a_validation_error(
    provider: ScriptedProvider, status: Any
) -> None:
    with pytest.raises(ValidationError) as caught:
        provider.validate({"states": [[status, 1], ["completed"]]})
    assert caught.value.field == "states[0]"


def test_bad_state_seconds_name_the_state(provider: ScriptedProvider) -> None:
    with pytest.raises(ValidationError) as caught:
        provider.validate({"states": [["running", -1], ["completed"]]})
    assert caught.value.field == "states[0]"


@pytest.mark.parametrize("option", ["cancel_delay", "reset_after"])
def test_an_absurd_delay_is_refused_at_launch(provider: ScriptedProvider, option: str) -> None:
    with pytest.raises(ValidationError):
        provider.validate({option: 1e300})
