"""Header names must be tokens, and never one that routes or frames the request (``Host``,
``Content-Length``, ``Transfer-Encoding``, ``Connection``, ``TE``, ``Upgrade``, ``Expect``,
``Proxy-*``); values hold no CR, LF or NUL. Refused at launch naming the field, and again at
call time, before anything is sent."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from orchestration.core.errors import PermanentProviderError, ValidationError
from orchestration.core.settings import Settings
from orchestration.providers import headers
from orchestration.providers.exchange import exchange
from orchestration.providers.http import HttpProvider
from orchestration.workflows import parsing

LOOPBACK = "localhost,127.0.0.0/8,::1"
SETTINGS = Settings(provider_hosts=LOOPBACK, provider_secrets={"AGENT_TOKEN": ["127.0.0.1"]})
FORBIDDEN = [
    "Host",
    "host",
    "Content-Length",
    "TRANSFER-ENCODING",
    "Connection",
    "TE",
    "Upgrade",
    "Expect",
    "Proxy-Authorization",
    "proxy-connection",
]


@pytest.fixture(autouse=True)
def no_connections(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise AssertionError(f"a connection was attempted: {args!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


def options(**extra: Any) -> dict[str, Any]:
    base = "http://127.0.0.1:9"
    built: dict[str, Any] = {
        "start": {"url": f"{base}/runs"},
        "status": {"url": f"{base}/runs/{{run_id}}"},
        "cancel": {"url": f"{base}/runs/{{run_id}}/cancel"},
        "run_id_path": "id",
        "status_path": "state",
    }
    built.update(extra)
    return built


@pytest.mark.parametrize("name", FORBIDDEN)
def test_routing_and_framing_headers_are_refused_at_launch(name: str) -> None:
    definition = {
        "name": "smuggle",
        "steps": [
            {
                "id": "a",
                "provider": "http",
                "task": "t",
                "with": options(
                    headers={"Authorization": {"secret": "AGENT_TOKEN"}, name: "attacker.example"}
                ),
            }
        ],
    }
    with pytest.raises(ValidationError) as caught:
        parsing.parse(definition, SETTINGS)
    assert caught.value.field == f"steps[0].with.headers.{name}"
    assert "set by the engine's HTTP client" in caught.value.problem


@pytest.mark.parametrize(
    ("where", "headers_", "field", "says"),
    [
        ("start", {"Bad Name": "x"}, "start.headers.Bad Name", "not a header name"),
        ("start", {"X-A:b": "x"}, "start.headers.X-A:b", "not a header name"),
        ("start", {"": "x"}, "start.headers.", "not a header name"),
        ("start", {7: "x"}, "start.headers.7", "as text"),
        ("cancel", {"X-Ok": "a\r\nHost: evil"}, "cancel.headers.X-Ok", "CR, LF or NUL"),
        ("status", {"X-Ok": "a\nb"}, "status.headers.X-Ok", "CR, LF or NUL"),
        ("start", {"X-Ok": "a\x00"}, "start.headers.X-Ok", "CR, LF or NUL"),
        (
            "start",
            {"Authorization": {"secret": "AGENT_TOKEN", "prefix": "Bearer\r\nX: "}},
            "start.headers.Authorization.prefix",
            "CR, LF or NUL",
        ),
        ("start", {"Transfer-Encoding": "chunked"}, "start.headers.Transfer-Encoding", "engine"),
    ],
)
def test_names_must_be_tokens_and_values_single_lines(
    where: str, headers_: dict[str, Any], field: str, says: str
) -> None:
    opts = options()
    opts[where] = {**opts[where], "headers": headers_}
    with pytest.raises(ValidationError) as caught:
        HttpProvider(SETTINGS).validate(opts)
    assert caught.value.field == field
    assert says in caught.value.problem


def test_ordinary_headers_pass() -> None:
    HttpProvider(SETTINGS).validate(
        options(headers={"X-Request-Id": "abc", "Accept": "application/json", "x_y.z~1": "ok"})
    )


@pytest.mark.parametrize(
    "sent",
    [
        {"Host": "attacker.example"},
        {"transfer-encoding": "chunked"},
        {"Proxy-Authorization": "x"},
        {"X-Ok": "a\r\nHost: evil"},
        {"Bad Name": "x"},
    ],
)
def test_the_call_time_check_refuses_before_sending(
    sent: dict[str, str], no_connections: list[Any]
) -> None:
    with exchange(SETTINGS) as http, pytest.raises(PermanentProviderError) as caught:
        http.send("POST", "http://127.0.0.1:9/runs", what="http start", headers=sent)
    assert "refused before sending" in str(caught.value)
    assert no_connections == []


def test_a_header_is_sent_once_whatever_its_case() -> None:
    assert headers.merged({"Authorization": "a", "x-a": "1"}, {"authorization": "b"}) == {
        "authorization": "b",
        "x-a": "1",
    }
