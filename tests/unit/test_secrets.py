"""Secrets bound to hosts (checked at launch and at call time) and their redaction."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from orchestration.errors import PermanentProviderError, ValidationError
from orchestration.providers.http import HttpProvider
from orchestration.providers.langgraph import LangGraphProvider
from orchestration.secrets import binding_problem, redact, redact_json, secret_value
from orchestration.settings import Settings

TOKEN = "tok-3f9a/+ x"
SETTINGS = Settings(
    provider_hosts="localhost,127.0.0.0/8,::1,agents.example.com:443",
    provider_secrets={
        "AGENT_TOKEN": ["agents.example.com:443"],
        "LOCAL_TOKEN": ["127.0.0.1", "localhost:2024"],
    },
)


@pytest.fixture(autouse=True)
def no_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launch checks never connect (these URLs need no DNS either)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a connection was attempted: {args!r}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_redact_masks_every_form_of_every_declared_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_TOKEN", TOKEN)
    local = 'q"uote\\d'
    monkeypatch.setenv("LOCAL_TOKEN", local)
    monkeypatch.setenv("UNDECLARED", "plain-value-kept")
    echoed = json.dumps({"got": "Bearer " + local})
    assert local not in echoed, "the JSON form differs from the value"
    text = (
        f"Bearer {TOKEN} | {echoed} | ?t=tok-3f9a%2F%2B%20x | t=tok-3f9a%2F%2B+x | plain-value-kept"
    )
    masked = redact(text, SETTINGS)
    assert "3f9a" not in masked and "uote" not in masked, masked
    assert masked.startswith("Bearer *** | ")
    assert "plain-value-kept" in masked, "only declared secrets are masked"


def test_redact_prefers_the_longer_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_TOKEN", "abc")
    monkeypatch.setenv("LOCAL_TOKEN", "abcdef")
    assert redact("x abcdef y abc", SETTINGS) == "x *** y ***"


def test_redact_json_walks_values_and_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_TOKEN", TOKEN)
    value = {"out": [f"said {TOKEN}", 3, None, {TOKEN: True}], "n": 1.5}
    assert redact_json(value, SETTINGS) == {"out": ["said ***", 3, None, {"***": True}], "n": 1.5}
    assert redact_json("unset secrets change nothing", Settings()) == (
        "unset secrets change nothing"
    )


def test_binding_is_by_declared_name_and_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert binding_problem("AGENT_TOKEN", "https://agents.example.com/runs", SETTINGS) is None
    assert binding_problem("LOCAL_TOKEN", "http://127.0.0.1:9/x", SETTINGS) is None
    assert binding_problem("LOCAL_TOKEN", "http://localhost:2024/", SETTINGS) is None
    wrong_port = binding_problem("LOCAL_TOKEN", "http://localhost:2025/", SETTINGS)
    assert wrong_port is not None and "add localhost:2025 to its hosts" in wrong_port
    other = binding_problem("AGENT_TOKEN", "https://evil.example.com/", SETTINGS)
    assert other is not None and "only to agents.example.com:443" in other
    missing = binding_problem("AWS_SECRET_ACCESS_KEY", "https://agents.example.com/", SETTINGS)
    assert missing is not None
    assert 'ORCH_PROVIDER_SECRETS=\'{"AWS_SECRET_ACCESS_KEY": ["agents.example.com:443"]}\'' in (
        missing
    )
    config = binding_problem("ORCH_DATABASE_URL", "http://127.0.0.1/", SETTINGS)
    assert config is not None and "configuration" in config

    # At call time the declaration is read again, and the variable must be set.
    monkeypatch.delenv("LOCAL_TOKEN", raising=False)
    with pytest.raises(PermanentProviderError, match="LOCAL_TOKEN is not set"):
        secret_value("LOCAL_TOKEN", "http://127.0.0.1/", SETTINGS, "http start")
    monkeypatch.setenv("LOCAL_TOKEN", "v")
    assert secret_value("LOCAL_TOKEN", "http://127.0.0.1/", SETTINGS, "http start") == "v"
    with pytest.raises(PermanentProviderError, match=r"only to 127\.0\.0\.1"):
        secret_value("LOCAL_TOKEN", "http://127.0.0.2/", SETTINGS, "http start")


def options(base: str = "http://127.0.0.1:9", **extra: Any) -> dict[str, Any]:
    built: dict[str, Any] = {
        "start": {"url": f"{base}/runs"},
        "status": {"url": f"{base}/runs/{{run_id}}"},
        "cancel": {"url": f"{base}/runs/{{run_id}}/cancel"},
        "run_id_path": "id",
        "status_path": "state",
    }
    built.update(extra)
    return built


def refused(opts: dict[str, Any]) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        HttpProvider(SETTINGS).validate(opts)
    return caught.value


def test_http_headers_may_only_name_secrets_bound_to_their_urls() -> None:
    provider = HttpProvider(SETTINGS)
    local = {"Authorization": {"env": "LOCAL_TOKEN", "prefix": "Bearer "}}
    provider.validate(options(headers=local))
    provider.validate(options(headers={"X-Key": {"secret": "LOCAL_TOKEN"}}))

    undeclared = options()
    undeclared["start"]["headers"] = {"Authorization": {"env": "AWS_SECRET_ACCESS_KEY"}}
    error = refused(undeclared)
    assert error.field == "start.headers.Authorization.env"
    assert "not declared in ORCH_PROVIDER_SECRETS" in error.problem

    # Top-level headers go to every endpoint: one on another host refuses them.
    mixed = options(headers={"Authorization": {"secret": "LOCAL_TOKEN"}})
    mixed["cancel"] = {"url": "https://agents.example.com/runs/{run_id}/cancel"}
    error = refused(mixed)
    assert error.field == "headers.Authorization.secret"
    assert "cancel.url" in error.problem and "agents.example.com:443" in error.problem

    # ... unless that endpoint sets the header itself.
    mixed["cancel"]["headers"] = {"Authorization": {"secret": "AGENT_TOKEN"}}
    provider.validate(mixed)
    mixed["cancel"]["headers"] = {"Authorization": {"secret": "LOCAL_TOKEN"}}
    assert refused(mixed).field == "cancel.headers.Authorization.secret"

    config = options(headers={"Authorization": {"env": "ORCH_DATABASE_URL"}})
    assert "configuration" in refused(config).problem
    both = options(headers={"Authorization": {"env": "LOCAL_TOKEN", "secret": "LOCAL_TOKEN"}})
    assert refused(both).field == "headers.Authorization"
    assert refused(options(headers={"A": {"secret": ""}})).field == "headers.A.secret"


def test_langgraph_key_only_when_declared_for_its_url() -> None:
    provider = LangGraphProvider(SETTINGS)
    provider.validate({"url": "http://localhost:2024", "assistant_id": "a"})
    provider.validate(
        {"url": "http://localhost:2024", "assistant_id": "a", "api_key_env": "LOCAL_TOKEN"}
    )
    for name, says in (
        ("LANGSMITH_API_KEY", "not declared"),
        ("AGENT_TOKEN", "only to agents.example.com:443"),
    ):
        with pytest.raises(ValidationError) as caught:
            provider.validate(
                {"url": "http://localhost:2024", "assistant_id": "a", "api_key_env": name}
            )
        assert caught.value.field == "api_key_env"
        assert says in caught.value.problem
