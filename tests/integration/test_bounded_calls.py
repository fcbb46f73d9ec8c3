"""Every provider call ends within its bound, however hostile the server, and goes only where
``ORCH_PROVIDER_HOSTS`` allows: real raw-socket servers on 127.0.0.1, no mocks of HTTP.

Each call is bounded by ``BOUND`` seconds, DNS to last byte; the tests allow ``MARGIN`` more
for the test's own threads on two shared cores. Nothing connects beyond loopback: the
``connects`` fixture records every TCP connect and refuses any other address.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestration.core.egress import AllowList
from orchestration.core.errors import PermanentProviderError, ProviderError, RetryableProviderError
from orchestration.core.settings import Settings
from orchestration.providers.base import ProviderStatus, TurnRef, TurnRequest
from orchestration.providers.exchange import MAX_RESPONSE_BYTES, exchange
from orchestration.providers.http import HttpProvider
from orchestration.providers.langgraph import LangGraphProvider
from orchestration.providers.transport import BoundedTransport, Deadline
from orchestration.runs.effects import _post_webhook
from tests.support.hostile_servers import (
    Behaviour,
    HostileServer,
    echo_headers,
    endless_chunked,
    huge_body,
    processing_flood,
    trickle_body,
    trickle_head,
    well_behaved,
)

pytestmark = pytest.mark.integration

BOUND = 2.0
MARGIN = 1.5
SECRET = "s3cret-bound-token-91ae"
#: Loopback, granted explicitly (the default list is empty).
LOOPBACK = "localhost,127.0.0.0/8,::1"
SETTINGS = Settings(
    provider_timeout=BOUND,
    provider_hosts=LOOPBACK,
    # agent.test is reached over http in these tests: its entry says so.
    provider_secrets={"AGENT_TOKEN": ["127.0.0.1", "http://agent.test"]},
)
KEY = "run-1:step:1"

BEHAVIOURS: dict[str, Callable[[], Behaviour]] = {
    "102-flood": processing_flood,
    "trickle-head": trickle_head,
    "trickle-body": trickle_body,
    "endless-chunked": endless_chunked,
    "50MB-announced": huge_body,
    "50MB-unannounced": lambda: huge_body(announce=False),
    "echo-500": echo_headers,
    "well-behaved": well_behaved,
}
SLOW = ("102-flood", "trickle-head", "trickle-body", "endless-chunked")
#: Elapsed seconds per (server, call), printed at the end of the module (``-s``).
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    for name, elapsed in sorted(FIGURES.items()):
        print(f"bounded call {name}: {elapsed:.2f}s (bound {BOUND}s)")


@pytest.fixture(autouse=True)
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every TCP connect the code makes; anything but loopback fails the test unconnected."""
    targets: list[tuple[str, int]] = []
    real = socket.create_connection

    def recording(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        targets.append(address)
        if not ipaddress.ip_address(address[0]).is_loopback:
            raise AssertionError(f"attempted a connection to {address}")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", recording)
    return targets


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AGENT_TOKEN", SECRET)
    return SECRET


def http_options(base: str) -> dict[str, Any]:
    return {
        "start": {"url": f"{base}/runs"},
        "status": {"url": f"{base}/runs/{{run_id}}"},
        "cancel": {"url": f"{base}/runs/{{run_id}}/cancel"},
        "headers": {"Authorization": {"secret": "AGENT_TOKEN", "prefix": "Bearer "}},
        "run_id_path": "id",
        "status_path": "state",
        "output_path": "result",
        "status_map": {"done": "completed"},
    }


def turn(options: dict[str, Any]) -> TurnRequest:
    return TurnRequest(KEY, "run-1", "step", 1, "hello", options)


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """Elapsed seconds and the result, or the provider error raised."""
    began = time.monotonic()
    try:
        outcome: Any = call()
    except ProviderError as exc:
        outcome = exc
    return time.monotonic() - began, outcome


def calls(url: str, provider: HttpProvider) -> dict[str, Callable[[], Any]]:
    options = http_options(url)
    provider.validate(options)
    ref = TurnRef(KEY, "turn-1", options)

    def send() -> Any:
        with exchange(SETTINGS) as http:
            return http.send("GET", f"{url}/probe", what="probe", headers={"X-A": "b"})

    return {
        "send": send,
        "start": lambda: provider.start(turn(options)),
        "status": lambda: provider.status(ref),
        "cancel": lambda: provider.cancel(ref),
    }


@pytest.mark.parametrize("call", ["send", "start", "status", "cancel"])
@pytest.mark.parametrize("server_name", list(BEHAVIOURS))
def test_every_call_ends_within_its_bound(server_name: str, call: str, token: str) -> None:
    with HostileServer(BEHAVIOURS[server_name]()) as server:
        elapsed, outcome = timed(calls(server.url, HttpProvider(SETTINGS))[call])
    FIGURES[f"{server_name} {call}"] = elapsed
    assert elapsed < BOUND + MARGIN, (elapsed, outcome)
    assert server.connections >= 1
    if server_name in SLOW:
        assert isinstance(outcome, RetryableProviderError), outcome
        assert f"no answer within {BOUND}" in str(outcome)
        assert elapsed > BOUND - 0.3, "the bound is the deadline, not earlier"
    elif server_name.startswith("50MB"):
        assert isinstance(outcome, PermanentProviderError), outcome
        assert f"over {MAX_RESPONSE_BYTES} B" in str(outcome)
    elif server_name == "echo-500":
        assert isinstance(outcome, RetryableProviderError), outcome
        assert "answered 500" in str(outcome)
        assert SECRET not in str(outcome)
        if call != "send":
            assert "Bearer ***" in str(outcome), outcome
    else:
        expected = {"start": "turn-1", "cancel": None}.get(call)
        if call == "status":
            assert outcome.status is ProviderStatus.COMPLETED and outcome.output == "ok"
        elif call == "send":
            assert outcome.body["id"] == "turn-1"
        else:
            assert outcome == expected


@pytest.mark.parametrize("announce", [True, False])
def test_a_huge_answer_is_not_read_past_the_cap(announce: bool) -> None:
    size = 50 * 1024 * 1024
    with HostileServer(huge_body(size, announce=announce)) as server:
        tracemalloc.start()
        try:
            elapsed, outcome = timed(calls(server.url, HttpProvider(SETTINGS))["send"])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert isinstance(outcome, PermanentProviderError), outcome
    assert elapsed < BOUND + MARGIN
    # The client hung up: the server could not hand over the whole body.
    assert server.sent < size / 2, server.sent
    if announce:
        assert "announced" in str(outcome)
        assert peak < 1024 * 1024, peak
    else:
        assert peak < MAX_RESPONSE_BYTES + 2 * 1024 * 1024, peak


def test_echoed_secrets_never_reach_the_error(token: str) -> None:
    options = http_options("http://127.0.0.1:1")  # replaced below
    with HostileServer(echo_headers()) as server:
        options = http_options(server.url)
        provider = HttpProvider(SETTINGS)
        _, started = timed(lambda: provider.start(turn(options)))
        lang = LangGraphProvider(SETTINGS)
        lang_options = {"url": server.url, "assistant_id": "a", "api_key_env": "AGENT_TOKEN"}
        lang.validate(lang_options)
        _, lang_started = timed(lambda: lang.start(turn(lang_options)))
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert any(r.headers.get("x-api-key") == SECRET for r in server.requests)
    for error in (started, lang_started):
        assert isinstance(error, RetryableProviderError), error
        assert SECRET not in str(error)
        assert "***" in str(error)


def test_langgraph_sends_no_key_it_was_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANGGRAPH_API_KEY", "operator-key-never-sent")
    monkeypatch.setenv("LANGSMITH_API_KEY", "operator-key-never-sent")
    with HostileServer(well_behaved({"run_id": "r-1"})) as server:
        provider = LangGraphProvider(SETTINGS)
        options = {"url": server.url, "assistant_id": "a"}
        provider.validate(options)
        assert provider.start(turn(options)) == "r-1"
    assert server.requests
    assert all("x-api-key" not in r.headers for r in server.requests)


def test_langgraph_start_is_bounded_as_a_whole() -> None:
    with HostileServer(trickle_body(interval=0.3)) as server:
        provider = LangGraphProvider(SETTINGS)
        options = {"url": server.url, "assistant_id": "a"}
        elapsed, outcome = timed(lambda: provider.start(turn(options)))
    FIGURES["trickle-body langgraph start"] = elapsed
    assert isinstance(outcome, RetryableProviderError), outcome
    assert elapsed < BOUND + MARGIN


def test_dns_rebinding_is_refused_before_connecting(
    connects: list[tuple[str, int]], token: str
) -> None:
    answers = iter([["127.0.0.1"], ["10.1.2.3"]])
    asked: list[str] = []

    def rebinding(host: str) -> Sequence[str]:
        asked.append(host)
        return next(answers)

    with HostileServer(well_behaved()) as server:
        port = server.url.rsplit(":", 1)[1]
        provider = HttpProvider(SETTINGS, resolver=rebinding)
        options = http_options(f"http://agent.test:{port}")
        options["start"]["url"] = f"http://agent.test:{port}/runs"
        for name in ("status", "cancel"):
            options[name]["url"] = server.url + options[name]["url"].split(port, 1)[1]
        provider.validate(options)  # launch: agent.test is 127.0.0.1, inside the list
        assert asked == ["agent.test"]
        with pytest.raises(PermanentProviderError) as caught:
            provider.start(turn(options))
    message = str(caught.value)
    assert "agent.test" in message and "10.1.2.3" in message and "ORCH_PROVIDER_HOSTS" in message
    assert asked == ["agent.test", "agent.test"]
    assert server.connections == 0 and server.requests == []
    assert connects == []


def test_a_checked_name_is_connected_by_its_checked_address(
    connects: list[tuple[str, int]], token: str
) -> None:
    with HostileServer(well_behaved()) as server:
        port = int(server.url.rsplit(":", 1)[1])
        provider = HttpProvider(SETTINGS, resolver=lambda host: ["127.0.0.1"])
        options = http_options(f"http://agent.test:{port}")
        provider.validate(options)
        assert provider.start(turn(options)) == "turn-1"
    assert connects == [("127.0.0.1", port)]
    assert server.requests[0].headers["host"] == f"agent.test:{port}"
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"


def test_slow_dns_fails_within_the_bound(connects: list[tuple[str, int]]) -> None:
    release = threading.Event()

    def stuck(host: str) -> Sequence[str]:
        release.wait(30)
        return ["127.0.0.1"]

    provider = HttpProvider(SETTINGS, resolver=stuck)
    options = http_options("http://127.0.0.1:9")
    del options["headers"]
    for name in ("start", "status", "cancel"):
        options[name]["url"] = options[name]["url"].replace("127.0.0.1:9", "slow.test:9")
    try:
        elapsed, outcome = timed(lambda: provider.start(turn(options)))
    finally:
        release.set()
    FIGURES["slow-dns start"] = elapsed
    assert isinstance(outcome, RetryableProviderError), outcome
    assert "slow.test" in str(outcome)
    assert elapsed < BOUND + MARGIN
    assert connects == []


def test_redirects_are_never_followed(token: str) -> None:
    with HostileServer(well_behaved(status="302 Found", headers={"Location": "/elsewhere"})) as s:
        _, outcome = timed(lambda: HttpProvider(SETTINGS).start(turn(http_options(s.url))))
    assert isinstance(outcome, PermanentProviderError), outcome
    assert "answered 302" in str(outcome)
    assert [r.target for r in s.requests] == ["/runs"]


def test_a_turn_without_run_id_is_addressed_by_its_key(token: str) -> None:
    with HostileServer(well_behaved()) as server:
        provider = HttpProvider(SETTINGS)
        options = http_options(server.url)
        options["status"] = {"url": f"{server.url}/turns/{{key}}"}
        options["cancel"] = {"url": f"{server.url}/turns/cancel", "body": {"key": "{key}"}}
        provider.validate(options)
        unknown = TurnRef(KEY, None, options)
        assert provider.status(unknown).status is ProviderStatus.COMPLETED
        provider.cancel(unknown)
        by_run_id = http_options(server.url)
        seen = len(server.requests)
        for call in (provider.cancel, provider.status):
            with pytest.raises(PermanentProviderError, match="cannot be addressed"):
                call(TurnRef(KEY, None, by_run_id))
    assert [r.target for r in server.requests] == ["/turns/run-1%3Astep%3A1", "/turns/cancel"]
    assert server.requests[1].body == b'{"key":"run-1:step:1"}'
    assert len(server.requests) == seen


def test_the_webhook_is_bounded_and_reaches_only_its_own_host() -> None:
    with HostileServer(processing_flood()) as server:
        settings = Settings(provider_hosts="", webhook_url=f"{server.url}/hook", webhook_timeout=1)
        elapsed, outcome = timed(lambda: _post_webhook(settings, {"run_id": "r"}))
    FIGURES["102-flood webhook"] = elapsed
    assert isinstance(outcome, RetryableProviderError), outcome
    assert elapsed < 1 + MARGIN
    with HostileServer(well_behaved(body="ok")) as server:
        settings = Settings(provider_hosts="", webhook_url=f"{server.url}/hook")
        _post_webhook(settings, {"run_id": "r"})
    assert server.requests[0].body == b'{"run_id":"r"}'


def _certificate(name: str) -> tuple[bytes, bytes]:
    """A self-signed certificate for ``name`` and its key, as PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def test_tls_verifies_the_urls_host_while_connecting_to_the_checked_address(
    tmp_path: Path, connects: list[tuple[str, int]]
) -> None:
    cert, key = _certificate("agent.test")
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    client_side = ssl.create_default_context(cadata=cert.decode())
    allow = AllowList.parse("127.0.0.0/8")
    with HostileServer(well_behaved(), tls=server_side) as server:
        port = int(server.url.rsplit(":", 1)[1])
        transport = BoundedTransport(
            allow, Deadline(BOUND), resolver=lambda host: ["127.0.0.1"], ssl_context=client_side
        )
        with httpx.Client(transport=transport) as client:
            answer = client.get(f"https://agent.test:{port}/runs")
        assert answer.json()["id"] == "turn-1"
        # The same server by its address: the certificate does not name it.
        transport = BoundedTransport(allow, Deadline(BOUND), ssl_context=client_side)
        with httpx.Client(transport=transport) as client, pytest.raises(httpx.ConnectError):
            client.get(f"https://127.0.0.1:{port}/runs")
    assert connects == [("127.0.0.1", port), ("127.0.0.1", port)]
    assert server.requests[0].headers["host"] == f"agent.test:{port}"


def test_a_tls_handshake_that_never_answers_ends_within_the_bound() -> None:
    with HostileServer(well_behaved()) as server:  # plain TCP: the ClientHello gets no answer
        url = server.url.replace("http://", "https://")
        with exchange(SETTINGS) as http:
            elapsed, outcome = timed(lambda: http.send("GET", f"{url}/runs", what="probe"))
    FIGURES["silent-tls-handshake send"] = elapsed
    assert isinstance(outcome, RetryableProviderError), outcome
    assert elapsed < BOUND + MARGIN


# --- what one request may weigh, and which headers it carries ------------------------------


def test_the_largest_request_is_the_budget_plus_the_clients_own_framing(
    token: str, connects: list[tuple[str, int]]
) -> None:
    """With ``ORCH_MAX_REQUEST_BYTES=8192``, the largest task a start sends is found by
    bisection; the request it makes on the wire is the budget plus what the HTTP client adds
    (request line, Host, Accept, User-Agent, Content-Length, ...), and one byte more is
    refused before connecting."""
    budget = 8192
    settings = SETTINGS.model_copy(update={"max_request_bytes": budget})
    provider = HttpProvider(settings)
    with HostileServer(well_behaved()) as server:
        options = http_options(server.url)

        def fits(size: int) -> bool:
            try:
                provider.start(TurnRequest(KEY, "run-1", "step", 1, "x" * size, options))
            except PermanentProviderError as exc:
                assert "ORCH_MAX_REQUEST_BYTES" in str(exc)
                return False
            return True

        low, high = 0, budget
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        connected = len(connects)
        assert not fits(low + 1)
        assert len(connects) == connected, "an over-budget request connects nowhere"
        largest = max(request.size for request in server.requests)
    assert budget <= largest <= budget + 256, largest


def test_each_header_goes_once_whatever_its_case_and_the_engines_own_win(token: str) -> None:
    with HostileServer(well_behaved()) as server:
        options = http_options(server.url)
        options["headers"] = {**options["headers"], "x-trace": "top", "idempotency-key": "forged"}
        options["start"]["headers"] = {"X-Trace": "own"}
        HttpProvider(SETTINGS).start(turn(options))
    head = server.requests[0].head.decode("latin-1").lower()
    assert head.count("\r\nx-trace:") == 1 and "\r\nx-trace: own" in head
    assert head.count("\r\nidempotency-key:") == 1
    assert f"\r\nidempotency-key: {KEY}" in head
    assert head.count("\r\nauthorization:") == 1
