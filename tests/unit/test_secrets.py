"""Secrets bound to hosts (checked at launch and at call time) and their redaction."""

from __future__ import annotations

import base64
import html
import json
import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestration.core.errors import PermanentProviderError, ValidationError
from orchestration.core.settings import Settings
from orchestration.limits.secrets import binding_problem, redact, redact_json, secret_value
from orchestration.providers.base import TurnRequest
from orchestration.providers.http import HttpProvider
from orchestration.providers.langgraph import LangGraphProvider
from tests.unit.support import PROPERTY

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


# --- a secret bound to host:port goes only over https ----------------------------------------

CLEAR = Settings(
    provider_hosts="agents.example.com:443,plain.example.com:8080,localhost",
    provider_secrets={
        "AGENT_TOKEN": ["agents.example.com:443"],
        "PLAIN_TOKEN": ["http://plain.example.com:8080", "https://agents.example.com:443"],
        "LOCAL_TOKEN": ["localhost:2024", "127.0.0.1"],
    },
)


def test_a_secret_goes_over_https_only_unless_its_entry_names_http_or_the_host_is_loopback() -> (
    None
):
    assert binding_problem("AGENT_TOKEN", "https://agents.example.com/runs", CLEAR) is None
    cleartext = binding_problem("AGENT_TOKEN", "http://agents.example.com:443/runs", CLEAR)
    assert cleartext is not None
    assert "over https only" in cleartext
    assert 'declare "http://agents.example.com:443"' in cleartext
    assert binding_problem("PLAIN_TOKEN", "http://plain.example.com:8080/runs", CLEAR) is None
    assert binding_problem("PLAIN_TOKEN", "https://plain.example.com:8080/runs", CLEAR) is None
    assert binding_problem("PLAIN_TOKEN", "https://agents.example.com/runs", CLEAR) is None
    assert binding_problem("LOCAL_TOKEN", "http://localhost:2024/runs", CLEAR) is None
    assert binding_problem("LOCAL_TOKEN", "http://127.0.0.1:9/runs", CLEAR) is None


def test_a_secret_bound_to_port_443_is_not_sent_in_cleartext_at_launch_or_at_call_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's case: bound to ``host:443``, named in an ``http://host:443/`` URL. Refused
    at launch, and at call time before any lookup or connection (the autouse guard)."""
    monkeypatch.setenv("AGENT_TOKEN", TOKEN)
    auth = {"Authorization": {"secret": "AGENT_TOKEN", "prefix": "Bearer "}}
    plain = options("http://agents.example.com:443", headers=auth)
    provider = HttpProvider(CLEAR)
    with pytest.raises(ValidationError) as caught:
        provider.validate(plain)
    assert caught.value.field == "headers.Authorization.secret"
    assert "over https only" in caught.value.problem
    request = TurnRequest("run-1:a:1", "run-1", "a", 1, "task", plain)
    with pytest.raises(PermanentProviderError, match="over https only") as refused:
        provider.start(request)
    assert TOKEN not in str(refused.value)
    provider.validate(options("https://agents.example.com", headers=auth))

    langgraph = {"url": "http://agents.example.com:443", "assistant_id": "a"}
    with pytest.raises(ValidationError, match="over https only"):
        LangGraphProvider(CLEAR).validate({**langgraph, "api_key_env": "AGENT_TOKEN"})


def test_an_entry_may_name_its_scheme_and_nothing_else() -> None:
    with pytest.raises(ValueError, match="after http:// write only HOST or HOST:PORT"):
        Settings(provider_secrets={"T": ["http://agents.example.com/path"]})
    Settings(provider_secrets={"T": ["https://agents.example.com:443", "HTTP://a.example.com/"]})


# --- redaction of the common encodings (best effort) -----------------------------------------

SECRET = "sk-live/4f9a+b&c<d>e\"f'g h"


@pytest.fixture
def echoed(monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("AGENT_TOKEN", SECRET)
    return SETTINGS


def test_a_secret_json_escaped_with_slashes_is_masked(echoed: Settings) -> None:
    slashed = json.dumps({"you_sent": SECRET}).replace("/", "\\/")
    assert "\\/" in slashed
    masked = redact(slashed, echoed)
    assert masked == '{"you_sent": "***"}', masked
    escaped_unicode = json.dumps({"k": SECRET}, ensure_ascii=True).replace("&", "\\u0026")
    assert redact(escaped_unicode, echoed) == '{"k": "***"}'


@pytest.mark.parametrize(
    "encode",
    [
        html.escape,
        lambda text: "".join(f"&#{ord(c)};" if c in "&<>\"'/ +" else c for c in text),
        lambda text: "".join(f"&#x{ord(c):X};" if c in "&<>\"'/ +" else c for c in text),
        lambda text: "".join(f"&#x{ord(c):04x};" if c in "&<>\"'" else c for c in text),
        lambda text: html.escape(text).replace("&#x27;", "&apos;").replace("&quot;", "&#34;"),
    ],
    ids=["named", "decimal", "hex", "hex-padded", "mixed"],
)
def test_a_secret_as_html_entities_is_masked(echoed: Settings, encode: Any) -> None:
    page = f"<p>token: {encode(SECRET)}</p>"
    assert SECRET not in page
    assert redact(page, echoed) == "<p>token: ***</p>"


B64_SECRET = "ghp_R3alS3cretT0ken-4242"


@pytest.mark.parametrize("alphabet", ["standard", "urlsafe"])
@pytest.mark.parametrize("before", [b"", b"a", b"ab", b"user:", b'{"k":"'])
def test_a_secret_in_base64_is_masked_at_every_alignment(
    monkeypatch: pytest.MonkeyPatch, alphabet: str, before: bytes
) -> None:
    monkeypatch.setenv("AGENT_TOKEN", B64_SECRET)
    encode = base64.b64encode if alphabet == "standard" else base64.urlsafe_b64encode
    text = encode(before + B64_SECRET.encode() + b'"} and more \xff\xfe').decode()
    masked = redact(f"Authorization: Basic {text}", SETTINGS)
    assert masked != f"Authorization: Basic {text}"
    assert_no_secret_in_base64(masked.removeprefix("Authorization: Basic "))


def assert_no_secret_in_base64(text: str) -> None:
    """No piece of ``text`` around the masks decodes, at any alignment, to a third of the
    secret or more."""
    piece = len(B64_SECRET) // 3
    for part in text.split("***"):
        normal = part.replace("-", "+").replace("_", "/").rstrip("=")
        for start in range(4):
            chunk = normal[start:]
            chunk = chunk[: len(chunk) - len(chunk) % 4]
            decoded = base64.b64decode(chunk) if chunk else b""
            for at in range(len(B64_SECRET) - piece + 1):
                assert B64_SECRET[at : at + piece].encode() not in decoded, (part, decoded)


@PROPERTY
@given(
    secret=st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=8, max_size=30),
    before=st.binary(max_size=5),
    after=st.binary(max_size=5),
)
def test_base64_redaction_holds_for_any_secret_and_neighbours(
    secret: str, before: bytes, after: bytes
) -> None:
    settings = Settings(provider_secrets={"ANY_TOKEN": ["127.0.0.1"]})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANY_TOKEN", secret)
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(before + secret.encode() + after).decode()
            masked = redact(text, settings)
            assert "***" in masked
            for part in masked.split("***"):
                normal = part.replace("-", "+").replace("_", "/").rstrip("=")
                for start in range(4):
                    chunk = normal[start:][: len(normal[start:]) - len(normal[start:]) % 4]
                    assert secret.encode() not in base64.b64decode(chunk)


def test_short_secrets_are_not_looked_for_in_base64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_TOKEN", "abc")
    ordinary = base64.b64encode(b"xabcx" * 4).decode()
    assert redact(ordinary, SETTINGS) == ordinary
