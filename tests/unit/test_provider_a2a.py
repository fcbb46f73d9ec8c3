"""The a2a provider without a server: its launch checks, what a task's JSON means, and the
calls it refuses to make (egress, secrets, a passed deadline), proved without a request.

Names resolve through an injected table, never DNS; a refused call is refused before any
connection (the resolver records what was asked, and no listener exists anywhere).
"""

from __future__ import annotations

import base64
import hashlib
import socket
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestration.core.errors import (
    PermanentProviderError,
    RetryableProviderError,
    ValidationError,
)
from orchestration.core.settings import Settings
from orchestration.providers import a2a_tasks
from orchestration.providers.a2a import A2AProvider, context_id, message_id
from orchestration.providers.base import ProviderStatus, TurnRef, TurnRequest

URL = "https://agents.example.com/a2a"


@pytest.fixture(autouse=True)
def no_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail on any connection attempt: everything here is decided before connecting."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a connection was attempted: {args!r}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def table(asked: list[str], **names: str) -> Callable[[str], Sequence[str]]:
    """A resolver from ``names`` (dots as ``_``) that records every name asked."""

    def resolver(host: str) -> Sequence[str]:
        asked.append(host)
        address = names.get(host.replace(".", "_").replace("-", "_"))
        if address is None:
            raise OSError(f"{host}: name does not resolve")
        return [address]

    return resolver


def provider(asked: list[str], **settings: Any) -> A2AProvider:
    chosen = Settings(**{"provider_hosts": "agents.example.com:443", **settings})
    return A2AProvider(chosen, resolver=table(asked, agents_example_com="203.0.113.7"))


def task(state: str, **fields: Any) -> dict[str, Any]:
    return {"id": "t1", "contextId": "c1", "status": {"state": state}, **fields}


def said(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": list(parts)}}


# --- launch checks --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field", "problem"),
    [
        ({}, "url", "is required"),
        ({"url": "ftp://agents.example.com/"}, "url", "absolute http(s) URL"),
        ({"url": URL, "skil": "echo"}, "skil", "is not known; known: url, skill, headers"),
        ({"url": URL, "skill": ""}, "skill", "must be the id of a skill"),
        ({"url": URL, "headers": ["x"]}, "headers", "must be a mapping"),
        ({"url": URL, "headers": {"Host": "x"}}, "headers.Host", ""),
        ({"url": URL, "headers": {"X-Key": {"secret": ""}}}, "headers.X-Key.secret", "must name"),
    ],
)
def test_bad_options_fail_the_launch_naming_the_field(
    options: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        provider([]).validate(options)
    assert refused.value.field == field
    assert problem in str(refused.value)


def test_a_url_outside_the_allow_list_fails_the_launch() -> None:
    asked: list[str] = []
    with pytest.raises(ValidationError) as refused:
        provider(asked, provider_hosts="127.0.0.0/8").validate({"url": URL})
    assert refused.value.field == "url"
    assert "ORCH_PROVIDER_HOSTS" in str(refused.value)


def test_a_secret_header_must_be_declared_for_the_agents_host() -> None:
    options = {"url": URL, "headers": {"Authorization": {"secret": "AGENT_KEY", "prefix": "B "}}}
    with pytest.raises(ValidationError) as refused:
        provider([]).validate(options)
    assert refused.value.field == "headers.Authorization.secret"
    assert "AGENT_KEY is not declared in ORCH_PROVIDER_SECRETS" in str(refused.value)
    provider([], provider_secrets={"AGENT_KEY": ["agents.example.com:443"]}).validate(options)


def test_good_options_pass() -> None:
    provider([]).validate({"url": URL, "skill": "echo", "headers": {"X-Team": "blue"}})


# --- calls refused before any request --------------------------------------------------


def test_a_host_that_resolves_outside_the_allow_list_is_never_connected() -> None:
    asked: list[str] = []
    refusing = A2AProvider(
        Settings(provider_hosts="203.0.113.0/24", provider_timeout=2),
        resolver=table(asked, agents_example_com="10.20.30.40"),
    )
    with pytest.raises(PermanentProviderError, match="refused before connecting"):
        refusing.status(TurnRef("r:s:1", "t1", {"url": URL}))
    assert asked == ["agents.example.com"]


def test_a_start_past_its_deadline_sends_nothing() -> None:
    asked: list[str] = []
    request = TurnRequest(
        key="r:s:1",
        run_id="r",
        step_id="s",
        attempt=1,
        input="hello",
        options={"url": URL},
        deadline=datetime.now(UTC) - timedelta(milliseconds=5),
    )
    with pytest.raises(RetryableProviderError, match="deadline passed"):
        provider(asked).start(request)
    assert asked == []


def test_a_secret_not_in_the_workers_environment_is_not_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENT_KEY", raising=False)
    asked: list[str] = []
    declared = provider(asked, provider_secrets={"AGENT_KEY": ["agents.example.com:443"]})
    options = {"url": URL, "headers": {"Authorization": {"secret": "AGENT_KEY"}}}
    with pytest.raises(PermanentProviderError, match="AGENT_KEY is not set"):
        declared.cancel(TurnRef("r:s:1", "t1", options))
    assert asked == []


# --- ids ----------------------------------------------------------------------------------


def test_ids_derive_from_the_turn_key() -> None:
    assert context_id("r:s:1") == context_id("r:s:1")
    assert len({context_id("r:s:1"), context_id("r:s:2"), message_id("r:s:1")}) == 3


# --- what a task says ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("TASK_STATE_SUBMITTED", ProviderStatus.RUNNING),
        ("TASK_STATE_WORKING", ProviderStatus.RUNNING),
        ("TASK_STATE_INPUT_REQUIRED", ProviderStatus.INPUT_REQUIRED),
        ("TASK_STATE_AUTH_REQUIRED", ProviderStatus.FAILED),
        ("TASK_STATE_COMPLETED", ProviderStatus.COMPLETED),
        ("TASK_STATE_FAILED", ProviderStatus.FAILED),
        ("TASK_STATE_REJECTED", ProviderStatus.FAILED),
        ("TASK_STATE_CANCELED", ProviderStatus.CANCELLED),
    ],
)
def test_each_state_maps(state: str, status: ProviderStatus) -> None:
    observed = a2a_tasks.observed(task(state))
    assert (observed.status, observed.raw) == (status, state)


def test_a_state_a2a_does_not_have_is_refused_naming_it() -> None:
    with pytest.raises(PermanentProviderError, match="'TASK_STATE_DREAMING'"):
        a2a_tasks.observed(task("TASK_STATE_DREAMING"))
    with pytest.raises(PermanentProviderError, match="state ''"):
        a2a_tasks.observed({"id": "t1"})


def test_completed_output_is_the_artifacts_parts() -> None:
    data = b"\x00\x01binary"
    artifacts = [
        {"artifactId": "a1", "parts": [{"text": "summary"}, {"data": {"n": 1}}]},
        {
            "artifactId": "a2",
            "parts": [
                {"raw": base64.b64encode(data).decode(), "filename": "x.bin"},
                {"url": "https://files.example.com/y.pdf", "mediaType": "application/pdf"},
            ],
        },
    ]
    observed = a2a_tasks.observed(task("TASK_STATE_COMPLETED", artifacts=artifacts))
    assert observed.output == [
        "summary",
        {"n": 1},
        {
            "file": {
                "name": "x.bin",
                "media_type": "application/octet-stream",
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "base64": base64.b64encode(data).decode(),
            }
        },
        {
            "file": {
                "name": None,
                "media_type": "application/pdf",
                "url": "https://files.example.com/y.pdf",
            }
        },
    ]


def test_one_part_is_the_output_itself_and_no_artifact_falls_back_to_the_message() -> None:
    one = [{"artifactId": "a", "parts": [{"data": {"answer": 42}}]}]
    assert a2a_tasks.observed(task("TASK_STATE_COMPLETED", artifacts=one)).output == {"answer": 42}
    replied = task("TASK_STATE_COMPLETED", status={"state": "TASK_STATE_COMPLETED", **said()})
    replied["status"]["message"]["parts"] = [{"text": "all done"}]
    assert a2a_tasks.observed(replied).output == "all done"
    assert a2a_tasks.observed(task("TASK_STATE_COMPLETED")).output is None


def test_input_required_prompts_with_the_agents_message() -> None:
    status = {"state": "TASK_STATE_INPUT_REQUIRED", **said({"text": "which branch?"})}
    observed = a2a_tasks.observed(task("", status=status))
    assert (observed.status, observed.prompt) == (ProviderStatus.INPUT_REQUIRED, "which branch?")


@pytest.mark.parametrize(
    ("state", "text", "expected"),
    [
        ("TASK_STATE_FAILED", "out of memory", "the agent failed the task: out of memory"),
        ("TASK_STATE_FAILED", None, "the agent failed the task"),
        ("TASK_STATE_REJECTED", "not my job", "the agent rejected the task: not my job"),
    ],
)
def test_a_failure_carries_the_agents_words(state: str, text: str | None, expected: str) -> None:
    status: dict[str, Any] = {"state": state}
    if text is not None:
        status.update(said({"text": text}))
    assert a2a_tasks.observed(task("", status=status)).error == expected


def test_auth_required_fails_with_what_to_do() -> None:
    status = {"state": "TASK_STATE_AUTH_REQUIRED", **said({"text": "log in"})}
    error = a2a_tasks.observed(task("", status=status)).error or ""
    assert error.startswith("the agent asks for authentication (auth-required)")
    assert "secret header" in error and error.endswith("the agent said: log in")


def test_unreadable_parts_are_refused() -> None:
    with pytest.raises(PermanentProviderError, match="not base64"):
        a2a_tasks.part_value({"raw": "***"})
    with pytest.raises(PermanentProviderError, match="none of text, data, raw, url"):
        a2a_tasks.part_value({"blob": 1})
    with pytest.raises(PermanentProviderError, match="not an object"):
        a2a_tasks.part_value("text")
