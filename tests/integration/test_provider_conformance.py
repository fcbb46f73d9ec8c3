"""One conformance suite for every provider (issue 32), each against its real server on
loopback: the contract of ``orchestration.providers.base`` asserted the same way for all.

The per-provider knowledge (how to make a server complete, work, fail, ask, hang) is the
adapter table of ``tests/support/conformance.py``; a new provider joins with one entry there.
A case a protocol cannot express is skipped, saying why. Figures (start to first status,
cancel to terminal, a turn's polls) are printed by ``test_figures``; run with ``-s``.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from orchestration.core.errors import (
    OrchestrationError,
    PermanentProviderError,
    RetryableProviderError,
    ValidationError,
)
from orchestration.core.settings import Settings
from orchestration.providers.base import (
    ENDED,
    Provider,
    ProviderStatus,
    TurnRef,
    TurnRequest,
    TurnStatus,
)
from tests.conftest import wait_for
from tests.support.conformance import (
    ADAPTERS,
    ANSWER,
    LOOPBACK,
    SECRET_ENV,
    Adapter,
    Play,
    request,
    silent,
    unavailable,
)
from tests.support.hostile_servers import HostileServer, well_behaved

pytestmark = pytest.mark.integration

#: One call's hard deadline in this suite (seconds).
DEADLINE = 3.0
#: The deadline of the hanging-server case, and the margin its upper bound allows: generous,
#: since the machine may be loaded; the point is that the call ends, not how fast.
SHORT_DEADLINE = 1.0
MARGIN = 6.0
SECRET = "conformance-s3cret-7c2e"
#: A documentation address (TEST-NET-3), outside every allow-list here: never connected to.
OUTSIDE = "http://203.0.113.7:8080"


@pytest.fixture(scope="module", params=list(ADAPTERS))
def adapter(request: pytest.FixtureRequest) -> Adapter:
    chosen = ADAPTERS[request.param]
    why = unavailable(chosen)
    if why is not None:
        pytest.skip(why)
    return chosen


@pytest.fixture(autouse=True)
def known_gap(adapter: Adapter, request: pytest.FixtureRequest) -> None:
    """A case this provider is known to fail runs as a strict expected failure."""
    gap = adapter.gaps.get(request.node.originalname)
    if gap is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=gap))


@pytest.fixture(scope="module")
def server(adapter: Adapter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with adapter.serve(tmp_path_factory.mktemp(adapter.name)) as running:
        yield running


def _provider(adapter: Adapter, server: Any, **settings: Any) -> Provider:
    values: dict[str, Any] = {
        "provider_timeout": DEADLINE,
        "provider_hosts": LOOPBACK,
        **adapter.settings(server),
        **settings,
    }
    return adapter.provider(Settings(**values))


@pytest.fixture(scope="module")
def provider(adapter: Adapter, server: Any) -> Provider:
    return _provider(adapter, server)


def _ref(req: TurnRequest, provider_run_id: str | None) -> TurnRef:
    return TurnRef(req.key, provider_run_id, req.options)


def _start(provider: Provider, play: Play, **extra: Any) -> tuple[TurnRequest, str]:
    play.arrange()
    req = request(play, **extra)
    return req, provider.start(req)


def _settled(provider: Provider, where: TurnRef, timeout: float = 30.0) -> tuple[TurnStatus, int]:
    """The first status that is neither pending nor running, and the polls it took."""
    polls = 0

    def seen() -> TurnStatus | None:
        nonlocal polls
        polls += 1
        observed = provider.status(where)
        live = (ProviderStatus.PENDING, ProviderStatus.RUNNING)
        return None if observed.status in live else observed

    return wait_for(seen, timeout, interval=0.05, what="the turn settles"), polls


def _running(provider: Provider, where: TurnRef) -> None:
    """Wait until the turn is seen running; one seen ended never will, and fails at once."""

    def seen() -> bool:
        status = provider.status(where).status
        if status in ENDED:
            pytest.fail(f"the turn ended {status.value} before it was seen running")
        return status is ProviderStatus.RUNNING

    wait_for(seen, 30, what="the turn runs")


def test_start_is_idempotent_per_key(adapter: Adapter, server: Any, provider: Provider) -> None:
    play = adapter.works(server)
    req, first = _start(provider, play)
    assert provider.start(req) == first
    assert adapter.turns(server, req) == 1
    # Another key is another turn (another run's: the next attempt of this one may wait for
    # this turn to end, as LangGraph's thread does).
    other, second = _start(provider, play)
    assert second != first
    assert adapter.turns(server, other) == 1
    provider.cancel(_ref(req, first))
    provider.cancel(_ref(other, second))


def test_a_redelivered_start_after_the_turn_ended_begins_nothing(
    adapter: Adapter, server: Any, provider: Provider
) -> None:
    req, first = _start(provider, adapter.completes(server))
    observed, _ = _settled(provider, _ref(req, first))
    assert observed.status in ENDED
    # The message is delivered again (a worker died before acking): the same turn, no other.
    assert provider.start(req) == first
    assert adapter.turns(server, req) == 1


def test_status_maps_running_completed_with_output_and_failed(
    adapter: Adapter, server: Any, provider: Provider
) -> None:
    working, working_id = _start(provider, adapter.works(server))
    _running(provider, _ref(working, working_id))
    provider.cancel(_ref(working, working_id))

    play = adapter.completes(server)
    req, run_id = _start(provider, play)
    observed, _ = _settled(provider, _ref(req, run_id))
    assert (observed.status, observed.output) == (ProviderStatus.COMPLETED, play.output)

    play = adapter.fails(server)
    req, run_id = _start(provider, play)
    observed, _ = _settled(provider, _ref(req, run_id))
    assert observed.status is ProviderStatus.FAILED
    assert play.error is not None and (observed.error or "").startswith(play.error)


def test_cancel_is_bounded_and_idempotent_on_a_live_and_a_finished_turn(
    adapter: Adapter, server: Any, provider: Provider
) -> None:
    req, run_id = _start(provider, adapter.works(server))
    where = _ref(req, run_id)
    _running(provider, where)
    began = time.monotonic()
    provider.cancel(where)
    assert time.monotonic() - began < DEADLINE + MARGIN
    observed, _ = _settled(provider, where)
    assert observed.status is ProviderStatus.CANCELLED
    provider.cancel(where)  # twice: not an error

    done, done_id = _start(provider, adapter.completes(server))
    finished, _ = _settled(provider, _ref(done, done_id))
    assert finished.status is ProviderStatus.COMPLETED
    provider.cancel(_ref(done, done_id))  # a finished turn: not an error, nothing changes
    provider.cancel(_ref(done, done_id))
    assert provider.status(_ref(done, done_id)).status is ProviderStatus.COMPLETED


def test_input_required_then_resume(adapter: Adapter, server: Any, provider: Provider) -> None:
    if adapter.asks is None:
        pytest.skip(adapter.no_resume)
    asking, resumed = adapter.asks(server)
    req, run_id = _start(provider, asking)
    observed, _ = _settled(provider, _ref(req, run_id))
    assert (observed.status, observed.prompt) == (ProviderStatus.INPUT_REQUIRED, asking.prompt)
    # The human's answer is the step's next attempt, resuming the park; it names the turn
    # that asked, as the engine does.
    answer, answer_id = _start(
        provider, resumed, run=req.run_id, attempt=2, resume=ANSWER, resuming=True, asked=run_id
    )
    assert provider.start(answer) == answer_id  # redelivered: still one resumption
    observed, _ = _settled(provider, _ref(answer, answer_id))
    assert (observed.status, observed.output) == (ProviderStatus.COMPLETED, resumed.output)


def test_the_hard_deadline_ends_every_call_to_a_server_that_hangs(
    adapter: Adapter, server: Any
) -> None:
    provider = _provider(adapter, server, provider_timeout=SHORT_DEADLINE)
    with HostileServer(silent) as hanging:
        for name, call in _hung_calls(adapter, server, provider, hanging.url):
            began = time.monotonic()
            with pytest.raises(RetryableProviderError):
                call()
            took = time.monotonic() - began
            assert took < SHORT_DEADLINE + MARGIN, (name, took)


def _hung_calls(
    adapter: Adapter, server: Any, provider: Provider, hanging: str
) -> list[tuple[str, Callable[[], object]]]:
    """The calls that meet a hanging server: start, status and cancel of a turn aimed at
    ``hanging``; for a provider with no URL, the status of a turn its server holds past the
    deadline (its start is prompt)."""
    if adapter.aim is not None:
        req = request(Play("hello", adapter.aim(hanging, False)))
        where = _ref(req, adapter.stand_in)
        return [
            ("start", lambda: provider.start(req)),
            ("status", lambda: provider.status(where)),
            ("cancel", lambda: provider.cancel(where)),
        ]
    assert adapter.hangs is not None, f"{adapter.name}: give the adapter `aim` or `hangs`"
    held, run_id = _start(provider, adapter.hangs(server))
    return [("status", lambda: provider.status(_ref(held, run_id)))]


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every outbound connect this process attempts, refused unsent and recorded."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise ConnectionRefusedError(f"the test refused a connection: {args!r}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def test_a_url_outside_the_allow_list_is_refused_before_any_connection(
    adapter: Adapter, server: Any, provider: Provider, connects: list[Any]
) -> None:
    if adapter.aim is None:
        pytest.skip(adapter.no_url)
    play = Play("hello", adapter.aim(OUTSIDE, False))
    with pytest.raises(ValidationError):
        provider.validate(play.options)
    with pytest.raises(OrchestrationError) as refused:
        provider.start(request(play))
    assert not isinstance(refused.value, RetryableProviderError), refused.value
    assert connects == [], "a connection was attempted"


def test_a_bound_secret_is_sent_to_its_host_only(
    adapter: Adapter, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if adapter.aim is None:
        pytest.skip(adapter.no_url)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with HostileServer(well_behaved()) as bound, HostileServer(well_behaved()) as elsewhere:
        port = bound.url.rsplit(":", 1)[1]
        provider = _provider(adapter, server, provider_secrets={SECRET_ENV: [f"127.0.0.1:{port}"]})
        to_bound = Play("hello", adapter.aim(bound.url, True))
        provider.validate(to_bound.options)
        with pytest.raises(OrchestrationError):  # the recording server's answer is no turn
            provider.start(request(to_bound))
        assert bound.requests, "the bound host got no request"
        assert any(SECRET in value for value in bound.requests[0].headers.values())

        to_elsewhere = Play("hello", adapter.aim(elsewhere.url, True))
        with pytest.raises(ValidationError):
            provider.validate(to_elsewhere.options)
        with pytest.raises(PermanentProviderError) as refused:
            provider.start(request(to_elsewhere))
        assert elsewhere.connections == 0
    assert SECRET not in str(refused.value)


def test_figures(adapter: Adapter, server: Any, provider: Provider) -> None:
    """Medians over a few turns against the real server: start to first status, cancel to
    terminal (the cancel call, then the status that says so), a turn's polls (every 50 ms)."""
    first, cancels, polls = [], [], []
    for _ in range(5):
        play = adapter.completes(server)
        began = time.perf_counter()
        req, run_id = _start(provider, play)
        provider.status(_ref(req, run_id))
        first.append(time.perf_counter() - began)
        _, count = _settled(provider, _ref(req, run_id))
        polls.append(count + 1)

        working, working_id = _start(provider, adapter.works(server))
        _running(provider, _ref(working, working_id))
        began = time.perf_counter()
        provider.cancel(_ref(working, working_id))
        _settled(provider, _ref(working, working_id))
        cancels.append(time.perf_counter() - began)
    print(
        f"\nconformance figures, {adapter.name} (median of 5): start to first status "
        f"{statistics.median(first) * 1000:.1f} ms; cancel to terminal "
        f"{statistics.median(cancels) * 1000:.1f} ms; polls per turn {statistics.median(polls)}"
    )
    assert all(count >= 1 for count in polls)
