"""The http provider against a real (small, local) agent service: no mocks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestration import providers
from orchestration.core.errors import (
    PermanentProviderError,
    RetryableProviderError,
    ValidationError,
)
from orchestration.core.settings import Settings
from orchestration.providers.base import ProviderStatus, TurnRef, TurnRequest, TurnStatus
from orchestration.providers.http import HttpProvider
from tests.support.agent_service import AgentService

pytestmark = pytest.mark.integration

SECRET = "s3cret-token-4f9a"
STATUS_MAP = {
    "queued": "pending",
    "working": "running",
    "done": "completed",
    "failed": "failed",
    "waiting": "input_required",
    "stopped": "cancelled",
}


@pytest.fixture
def service() -> Iterator[AgentService]:
    running = AgentService().start()
    yield running
    running.stop()


#: Loopback, granted explicitly (the default list is empty).
LOOPBACK = "localhost,127.0.0.0/8,::1"
#: The service's token may go to the loopback service only.
SETTINGS = Settings(
    provider_timeout=5, provider_hosts=LOOPBACK, provider_secrets={"AGENT_TOKEN": ["127.0.0.1"]}
)


@pytest.fixture
def provider() -> HttpProvider:
    return HttpProvider(SETTINGS)


def options_for(service: AgentService, **extra: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "start": {"url": f"{service.url}/runs", "body": {"task": "{task}", "mode": "fast"}},
        "status": {"url": f"{service.url}/runs/{{run_id}}"},
        "cancel": {"url": f"{service.url}/runs/{{run_id}}/cancel"},
        "run_id_path": "data.id",
        "status_path": "state",
        "output_path": "result",
        "error_path": "failure.message",
        "prompt_path": "question",
        "status_map": STATUS_MAP,
    }
    options.update(extra)
    return options


def request(options: dict[str, Any], key: str = "run-1:step:1", task: Any = "hello") -> TurnRequest:
    run_id, step_id, attempt = key.split(":")
    return TurnRequest(
        key=key, run_id=run_id, step_id=step_id, attempt=int(attempt), input=task, options=options
    )


def poll_until(
    observe: Callable[[], TurnStatus], done: Callable[[TurnStatus], bool], within: float = 10.0
) -> TurnStatus:
    deadline = time.monotonic() + within
    while True:
        seen = observe()
        if done(seen) or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


def test_registered_and_validates(service: AgentService) -> None:
    provider = providers.get_provider("http", Settings(provider_hosts=LOOPBACK))
    assert provider.name == "http"
    provider.validate(options_for(service))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"start": None}, "start"),
        ({"status": {"url": f"{service.url}/runs"}}, "status.url"),
        ({"cancel": {"url": "ftp://x/{run_id}"}}, "cancel.url"),
        ({"status_map": {"done": "finished"}}, "status_map.done"),
        ({"headers": {"Authorization": {"value": SECRET}}}, "headers.Authorization"),
        ({"run_id_path": ""}, "run_id_path"),
        ({"shape": 1}, "shape"),
        ({"start": {"url": "http://10.1.2.3/runs"}}, "start.url"),
        ({"headers": {"Authorization": {"env": "AGENT_TOKEN"}}}, "headers.Authorization.env"),
    ]
    for extra, field in cases:
        with pytest.raises(ValidationError) as caught:
            provider.validate(options_for(service, **extra))
        assert caught.value.field == field


def test_turn_completes_with_the_services_answer(
    service: AgentService, provider: HttpProvider
) -> None:
    options = options_for(service)
    run_id = provider.start(request(options, task={"goal": "ship"}))
    ref = TurnRef(key="run-1:step:1", provider_run_id=run_id, options=options)
    first = provider.status(ref)
    assert (first.status, first.raw) == (ProviderStatus.RUNNING, "working")
    final = poll_until(lambda: provider.status(ref), lambda s: s.status != ProviderStatus.RUNNING)
    assert final == TurnStatus(
        ProviderStatus.COMPLETED, raw="done", output={"echo": {"goal": "ship"}}
    )
    assert service.turns[run_id].task == {"goal": "ship"}
    snapshot = provider.snapshot(ref)
    assert snapshot["status"] == "done"
    assert snapshot["output"] == {"echo": {"goal": "ship"}}


def test_start_is_idempotent_per_key(service: AgentService, provider: HttpProvider) -> None:
    options = options_for(service)
    first = provider.start(request(options))
    again = provider.start(request(options))
    other = provider.start(request(options, key="run-1:step:2"))
    assert first == again != other
    assert service.start_calls == 3
    assert len(service.turns) == 2


def test_start_carries_its_deadline_and_a_late_one_begins_nothing(
    service: AgentService, provider: HttpProvider
) -> None:
    options = options_for(service)
    late = replace(request(options), deadline=datetime.now(UTC) - timedelta(seconds=1))
    with pytest.raises(RetryableProviderError, match="408"):
        provider.start(late)
    assert service.turns == {}
    deadline = datetime.now(UTC) + timedelta(seconds=30)
    provider.start(replace(late, deadline=deadline))
    assert len(service.turns) == 1
    assert service.deadlines[-1] is not None
    assert abs(datetime.fromisoformat(service.deadlines[-1]) - deadline) < timedelta(seconds=0.01)


def test_failed_and_input_required_turns(service: AgentService, provider: HttpProvider) -> None:
    options = options_for(service)
    service.script = [("failed", 0)]
    failed = provider.status(TurnRef("k:s:1", provider.start(request(options)), options))
    assert failed == TurnStatus(ProviderStatus.FAILED, raw="failed", error="the agent gave up")
    service.script = [("waiting", 0)]
    ref = TurnRef("k:s:2", provider.start(request(options, key="run-1:step:2")), options)
    waiting = provider.status(ref)
    assert (waiting.status, waiting.prompt) == (ProviderStatus.INPUT_REQUIRED, "which branch?")


def test_unknown_status_word_is_permanent_and_named(
    service: AgentService, provider: HttpProvider
) -> None:
    options = options_for(service)
    service.script = [("exploded", 0)]
    ref = TurnRef("k:s:1", provider.start(request(options)), options)
    with pytest.raises(PermanentProviderError) as caught:
        provider.status(ref)
    message = str(caught.value)
    assert "'exploded'" in message
    assert "known words: done, failed, queued, stopped, waiting, working" in message


def test_cancel_stops_the_turn_and_is_idempotent(
    service: AgentService, provider: HttpProvider
) -> None:
    options = options_for(service)
    service.script = [("working", 60), ("done", 0)]
    ref = TurnRef("k:s:1", provider.start(request(options)), options)
    provider.cancel(ref)
    assert provider.status(ref) == TurnStatus(ProviderStatus.CANCELLED, raw="stopped")
    provider.cancel(ref)
    provider.cancel(TurnRef("k:s:1", "turn-unknown", options))
    # A start that timed out after sending: its run id is unknown, and this service's cancel
    # needs one; the engine records that the turn cannot be addressed.
    with pytest.raises(PermanentProviderError, match="cannot be addressed"):
        provider.cancel(TurnRef("k:s:1", None, options))


def test_hanging_service_is_an_outage_within_the_bound(service: AgentService) -> None:
    provider = HttpProvider(
        Settings(provider_timeout=1, heartbeat_timeout=60, provider_hosts=LOOPBACK)
    )
    options = options_for(service)
    run_id = provider.start(request(options))
    service.hang = 30
    began = time.monotonic()
    with pytest.raises(RetryableProviderError, match="no answer within 1"):
        provider.status(TurnRef("k:s:1", run_id, options))
    assert time.monotonic() - began < 2.5


def test_outages_and_refusals_are_classified(service: AgentService, provider: HttpProvider) -> None:
    options = options_for(service)
    service.start_status = 503
    with pytest.raises(RetryableProviderError, match="503"):
        provider.start(request(options))
    assert service.start_calls > 1, "a start carrying its key is retried within the bound"
    service.start_status = 400
    with pytest.raises(PermanentProviderError, match="400"):
        provider.start(request(options))
    service.start_status = None
    with pytest.raises(PermanentProviderError, match=r"no run id at 'data\.nope'"):
        provider.start(request(options_for(service, run_id_path="data.nope")))
    service.stop()
    with pytest.raises(RetryableProviderError, match="cannot reach"):
        provider.status(TurnRef("k:s:1", "turn-1", options))


def test_secret_header_comes_from_env_and_never_shows(
    service: AgentService, provider: HttpProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    service.token = SECRET
    auth = {"Authorization": {"env": "AGENT_TOKEN", "prefix": "Bearer "}}
    options = options_for(service, headers=auth)
    provider.validate(options)
    assert SECRET not in repr(options)
    with pytest.raises(ValidationError, match="not declared in ORCH_PROVIDER_SECRETS") as bare:
        HttpProvider(Settings(provider_hosts=LOOPBACK)).validate(options)
    assert bare.value.field == "headers.Authorization.env"

    monkeypatch.delenv("AGENT_TOKEN", raising=False)
    with pytest.raises(PermanentProviderError, match="AGENT_TOKEN") as missing:
        provider.start(request(options))
    assert SECRET not in str(missing.value)

    monkeypatch.setenv("AGENT_TOKEN", SECRET)
    ref = TurnRef("run-1:step:1", provider.start(request(options)), options)
    assert provider.status(ref).raw == "working"

    service.token = "another-token"
    with pytest.raises(PermanentProviderError, match="401") as refused:
        provider.status(ref)
    assert "bad credentials" in str(refused.value)
    assert SECRET not in str(refused.value)
    assert "***" in str(refused.value)
