"""The allow-list: parsing, the launch check and the connect-time check, with no connection.

Every refusal here is decided before a socket is opened: the autouse guard fails the test on
any connection attempt, and names are resolved by injected resolvers, never by DNS.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from orchestration.core.egress import AllowList, parse_entry, resolve
from orchestration.core.errors import ConfigurationError, PermanentProviderError, ValidationError
from orchestration.core.settings import Settings, load_settings
from orchestration.limits.host_lookups import check_launch_url
from orchestration.providers.http import HttpProvider
from orchestration.providers.langgraph import LangGraphProvider
from orchestration.providers.transport import Deadline, GuardedBackend

#: The list the demo and the tests grant: loopback.
LOOPBACK_HOSTS = "localhost,127.0.0.0/8,::1"
LOOPBACK = AllowList.parse(LOOPBACK_HOSTS)


@pytest.fixture(autouse=True)
def no_connections(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Fail on any connection attempt: these refusals must happen before connect."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise AssertionError(f"a connection was attempted: {args!r}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def mapped(table: dict[str, Sequence[str]]) -> Callable[[str], Sequence[str]]:
    """A resolver from a table; an unknown name fails like DNS does."""

    def resolver(host: str) -> Sequence[str]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]

    return resolver


# --- parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "network", "port"),
    [
        ("localhost", "localhost", None, None),
        ("Agents.Example.COM.", "agents.example.com", None, None),
        ("agents.example.com:443", "agents.example.com", None, 443),
        ("10.1.2.3", None, "10.1.2.3/32", None),
        ("10.1.2.3:8080", None, "10.1.2.3/32", 8080),
        ("10.0.0.0/8", None, "10.0.0.0/8", None),
        ("10.0.0.0/8:443", None, "10.0.0.0/8", 443),
        ("::1", None, "::1/128", None),
        ("fd00::/8", None, "fd00::/8", None),
        ("[::1]:8080", None, "::1/128", 8080),
        ("[fd00::/8]:443", None, "fd00::/8", 443),
        ("[::1]", None, "::1/128", None),
        (" cafe.be ", "cafe.be", None, None),
    ],
)
def test_entries_parse(text: str, name: str | None, network: str | None, port: int | None) -> None:
    entry = parse_entry(text)
    assert entry.name == name
    assert entry.network == (ipaddress.ip_network(network) if network else None)
    assert entry.port == port


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("http://agents.example.com", "looks like a URL"),
        ("agents.example.com:http", "port must be a number"),
        ("agents.example.com:70000", "port must be a number"),
        ("10.0.0.1/8", "has host bits set"),
        ("10.0.0.300", "not a valid IP address"),
        ("fd00::1:443", ""),  # an IPv6 address, not a port: parses (see the next case)
        ("fe80::1::2", "[ADDR]:PORT"),
        ("[10.0.0.1]:80", "brackets hold an IPv6"),
        ("[::1]x", "brackets hold an IPv6"),
        ("bad_host!", "is not a host name"),
        ("a..b", "is not a host name"),
        ("2130706433", "not a valid IP address"),
        ("example.2130706433", "write an IP address"),
        ("bücher.de", "xn--"),
    ],
)
def test_bad_entries_are_named(text: str, says: str) -> None:
    if not says:
        assert parse_entry(text).network == ipaddress.ip_network(text)
        return
    with pytest.raises(ValueError, match=r".") as caught:
        parse_entry(text)
    assert text.strip() in str(caught.value)
    assert says in str(caught.value)


def test_list_ignores_blank_entries_and_an_empty_list_allows_nothing() -> None:
    assert len(AllowList.parse("localhost, ,127.0.0.0/8,").entries) == 2
    assert not AllowList.parse("").permits_url("http://127.0.0.1/")


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("ORCH_PROVIDER_HOSTS", "localhost,http://evil.example", "looks like a URL"),
        ("ORCH_PROVIDER_SECRETS", '{"ORCH_DATABASE_URL": ["localhost"]}', "configuration"),
        ("ORCH_PROVIDER_SECRETS", '{"TOKEN": ["a b"]}', "is not a host name"),
        ("ORCH_PROVIDER_SECRETS", '{"TOKEN": []}', "list the hosts"),
        ("ORCH_PROVIDER_SECRETS", '{"NOT-A-NAME": ["localhost"]}', "environment variable"),
        ("ORCH_PROVIDER_SECRETS", '{"TOKEN": "localhost"}', ""),
        ("ORCH_PROVIDER_SECRETS", "{not json", "JSON"),
    ],
)
def test_bad_settings_stop_start_up_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, says: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert f"{variable}:" in str(caught.value)
    assert says in str(caught.value)


def test_good_settings_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_PROVIDER_HOSTS", "agents.example.com:443,10.0.0.0/8,[fd00::/8]:443")
    monkeypatch.setenv("ORCH_PROVIDER_SECRETS", '{"AGENT_TOKEN": ["agents.example.com:443"]}')
    settings = load_settings()
    assert settings.provider_secrets == {"AGENT_TOKEN": ["agents.example.com:443"]}
    # Settings built from a process's environment as arguments decode the JSON too.
    built = Settings(provider_secrets='{"AGENT_TOKEN": ["localhost"]}')
    assert built.provider_secrets == {"AGENT_TOKEN": ["localhost"]}


# --- the launch check (no DNS) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://localhost:2024/runs", True),
        ("http://LOCALHOST./runs", True),
        ("http://127.0.0.1:9/runs/{run_id}", True),
        ("http://127.200.1.1/", True),
        ("http://[::1]:8080/", True),
        ("https://[::ffff:127.0.0.1]/", True),
        ("http://10.1.2.3/", False),
        ("http://192.168.1.10/", False),
        ("http://172.16.0.1/", False),
        ("http://[fd00::1]/", False),
        ("http://8.8.8.8/", False),
        ("https://agents.example.com/", False),
        ("http://169.254.169.254/latest/meta-data/", False),
        ("http://[fe80::1]/", False),
        ("http://[fd00:ec2::254]/", False),
        ("http://0.0.0.0:8080/", False),
        ("http://2130706433/", False),  # a name here; only DNS would make it 127.0.0.1
        ("ftp://localhost/", False),
        ("not a url", False),
    ],
)
def test_the_loopback_list_allows_loopback_only(url: str, allowed: bool) -> None:
    assert LOOPBACK.permits_url(url) is allowed


def test_the_default_list_is_empty_and_refuses_every_provider_url_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loopback is not granted by default: the API, Flower and /metrics listen there."""
    monkeypatch.delenv("ORCH_PROVIDER_HOSTS", raising=False)
    settings = load_settings()
    assert settings.provider_hosts == ""
    asked: list[str] = []

    def resolver(host: str) -> Sequence[str]:
        asked.append(host)
        return ["127.0.0.1"]

    for base in ("http://127.0.0.1:8000", "http://localhost:5555", "https://agents.example.com"):
        with pytest.raises(ValidationError) as caught:
            HttpProvider(settings, resolver=resolver).validate(http_options(base))
        assert caught.value.field == "start.url"
        assert "ORCH_PROVIDER_HOSTS is empty" in caught.value.problem
        with pytest.raises(ValidationError, match="ORCH_PROVIDER_HOSTS is empty"):
            LangGraphProvider(settings, resolver=resolver).validate(
                {"url": base, "assistant_id": "a"}
            )
    empty = GuardedBackend(AllowList.parse(settings.provider_hosts), Deadline(2), resolver)
    with pytest.raises(PermanentProviderError, match="ORCH_PROVIDER_HOSTS is empty"):
        empty.connect_tcp("localhost", 8000)
    assert asked == ["localhost"], "the launch check looks nothing up"


def test_sensitive_addresses_need_their_own_entry() -> None:
    everything = AllowList.parse("0.0.0.0/0,::/0")
    for url in (
        "http://169.254.169.254/",
        "http://169.254.170.2/",
        "http://100.100.100.200/",
        "http://168.63.129.16/",
        "http://169.254.10.10/",
        "http://[fe80::1]/",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
        "http://0.0.0.0/",
        "http://[::]/",
    ):
        assert not everything.permits_url(url), url
    assert everything.permits_url("http://8.8.8.8/")
    assert everything.permits_url("http://[2001:db8::1]/")

    link_local = AllowList.parse("169.254.0.0/16,fe80::/10")
    assert link_local.permits_url("http://169.254.10.10/")
    assert link_local.permits_url("http://[fe80::1]/")
    assert not link_local.permits_url("http://169.254.169.254/")

    metadata = AllowList.parse("169.254.169.254:80,fd00:ec2::254")
    assert metadata.permits_url("http://169.254.169.254/")
    assert not metadata.permits_url("http://169.254.169.254:8080/")
    assert metadata.permits_url("http://[fd00:ec2::254]/")
    assert metadata.permits_url("http://[::ffff:169.254.169.254]/")


def test_ports() -> None:
    allow = AllowList.parse("agents.example.com:443,[::1]:8080,10.0.0.0/8:8443,build.example.com")
    assert allow.permits_url("https://agents.example.com/runs")
    assert allow.permits_url("http://agents.example.com:443/runs")
    assert not allow.permits_url("http://agents.example.com/runs")
    assert not allow.permits_url("https://agents.example.com:8443/runs")
    assert allow.permits_url("http://[::1]:8080/")
    assert not allow.permits_url("http://[::1]:8081/")
    assert not allow.permits_url("http://[::1]/")
    assert allow.permits_url("https://10.9.8.7:8443/")
    assert not allow.permits_url("https://10.9.8.7/")
    assert allow.permits_url("http://build.example.com:1234/")
    assert not allow.permits_url("http://sub.build.example.com/")


# --- the connect-time check ----------------------------------------------------------------


def test_connect_time_check_of_resolved_addresses() -> None:
    allow = AllowList.parse("agents.example.com,metadata.internal,127.0.0.0/8,[fd00::/8]:443")
    address = ipaddress.ip_address
    # Listed by name: may resolve anywhere except sensitive addresses.
    assert allow.refusal("agents.example.com", 443, address("203.0.113.7")) is None
    assert allow.refusal("agents.example.com", 80, address("2001:db8::7")) is None
    refused = allow.refusal("metadata.internal", 80, address("169.254.169.254"))
    assert refused is not None and "metadata" in refused
    assert allow.refusal("metadata.internal", 80, address("fe80::1")) is not None
    # Not listed: only listed networks.
    assert allow.refusal("agent.test", 80, address("127.0.0.1")) is None
    assert allow.refusal("agent.test", 443, address("fd00::5")) is None
    assert allow.refusal("agent.test", 80, address("fd00::5")) is not None
    refusal = allow.refusal("agent.test", 80, address("10.1.2.3"))
    assert refusal is not None
    assert "agent.test" in refusal and "10.1.2.3" in refusal and "ORCH_PROVIDER_HOSTS" in refusal


def test_backend_refuses_before_connecting(no_connections: list[Any]) -> None:
    backend = GuardedBackend(
        LOOPBACK, Deadline(2), mapped({"agent.test": ["127.0.0.1", "10.1.2.3"]})
    )
    with pytest.raises(PermanentProviderError) as caught:
        backend.connect_tcp("agent.test", 8080)
    message = str(caught.value)
    assert "agent.test" in message and "10.1.2.3" in message and "ORCH_PROVIDER_HOSTS" in message
    with pytest.raises(PermanentProviderError, match=r"169\.254\.169\.254"):
        GuardedBackend(AllowList.parse("0.0.0.0/0"), Deadline(2)).connect_tcp("169.254.169.254", 80)
    assert no_connections == []


# --- resolving within a bound ------------------------------------------------------------


@pytest.fixture
def stuck_resolver() -> Iterator[Callable[[str], Sequence[str]]]:
    release = threading.Event()

    def resolver(host: str) -> Sequence[str]:
        release.wait(30)
        return ["127.0.0.1"]

    yield resolver
    release.set()


def test_resolve_is_bounded(stuck_resolver: Callable[[str], Sequence[str]]) -> None:
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=r"agent\.test"):
        resolve("agent.test", 0.3, stuck_resolver)
    assert time.monotonic() - began < 1.0
    with pytest.raises(OSError, match=r"cannot resolve agent\.test"):
        resolve("agent.test", 1, mapped({}))
    assert resolve("[::1]", 1, mapped({})) == [ipaddress.ip_address("::1")]


def test_launch_check_resolves_only_names_that_are_not_listed(
    stuck_resolver: Callable[[str], Sequence[str]],
) -> None:
    asked: list[str] = []

    def counting(host: str) -> Sequence[str]:
        asked.append(host)
        return {"agent.test": ["127.0.0.1"], "evil.test": ["127.0.0.1", "10.1.2.3"]}[host]

    check_launch_url(LOOPBACK, "http://localhost:2024/", "url", resolver=counting)
    check_launch_url(LOOPBACK, "http://127.0.0.1/", "url", resolver=counting)
    assert asked == []
    check_launch_url(LOOPBACK, "http://agent.test:8080/runs", "url", resolver=counting)
    assert asked == ["agent.test"]
    with pytest.raises(ValidationError) as caught:
        check_launch_url(LOOPBACK, "http://evil.test/", "start.url", resolver=counting)
    assert caught.value.field == "start.url"
    assert "10.1.2.3" in caught.value.problem
    assert "add evil.test:80 to ORCH_PROVIDER_HOSTS" in caught.value.problem

    began = time.monotonic()
    with pytest.raises(ValidationError, match="took longer"):
        check_launch_url(LOOPBACK, "http://slow.test/", "url", resolver=stuck_resolver, timeout=0.3)
    assert time.monotonic() - began < 1.0
    with pytest.raises(ValidationError, match="placeholders"):
        check_launch_url(LOOPBACK, "http://{run_id}.localhost/", "url", resolver=counting)
    with pytest.raises(ValidationError, match=r"add \[fd00::1\]:443 to ORCH_PROVIDER_HOSTS"):
        check_launch_url(LOOPBACK, "https://[fd00::1]/", "url", resolver=counting)


# --- providers refuse at launch -------------------------------------------------------------


def http_options(base: str) -> dict[str, Any]:
    return {
        "start": {"url": f"{base}/runs"},
        "status": {"url": f"{base}/runs/{{run_id}}"},
        "cancel": {"url": f"{base}/runs/{{run_id}}/cancel"},
        "run_id_path": "id",
        "status_path": "state",
    }


@pytest.mark.parametrize(
    "base",
    [
        "http://10.1.2.3:8080",
        "http://169.254.169.254",
        "http://[fe80::1]",
        "https://8.8.8.8",
        "https://public.test",
    ],
)
def test_providers_refuse_urls_outside_the_list(base: str) -> None:
    resolver = mapped({"public.test": ["93.184.216.34"]})
    http = HttpProvider(Settings(provider_hosts=LOOPBACK_HOSTS), resolver=resolver)
    with pytest.raises(ValidationError) as caught:
        http.validate(http_options(base))
    assert caught.value.field == "start.url"
    assert "ORCH_PROVIDER_HOSTS" in caught.value.problem
    options = {**http_options("http://127.0.0.1:9"), "cancel": {"url": f"{base}/{{run_id}}"}}
    with pytest.raises(ValidationError) as cancel:
        http.validate(options)
    assert cancel.value.field == "cancel.url"

    langgraph = LangGraphProvider(Settings(provider_hosts=LOOPBACK_HOSTS), resolver=resolver)
    with pytest.raises(ValidationError) as refused:
        langgraph.validate({"url": base, "assistant_id": "agent"})
    assert refused.value.field == "url"
    assert "add" in refused.value.problem and "ORCH_PROVIDER_HOSTS" in refused.value.problem


def test_providers_accept_listed_hosts() -> None:
    settings = Settings(provider_hosts="agents.example.com:443,10.0.0.0/8")
    resolver = mapped({})
    HttpProvider(settings, resolver=resolver).validate(http_options("https://agents.example.com"))
    HttpProvider(settings, resolver=resolver).validate(http_options("http://10.1.2.3:8080"))
    LangGraphProvider(settings, resolver=resolver).validate(
        {"url": "https://agents.example.com", "assistant_id": "agent"}
    )
