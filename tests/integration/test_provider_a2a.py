"""The a2a provider against a real A2A server: the a2a-sdk's own, with the small executor of
``tests/support/a2a_agent.py``, on a loopback port. No mocks.

Closing-note figures (start to first status, cancel to terminal, a turn's polls) are printed
by ``test_figures``; run with ``-s`` to see them.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestration import providers
from orchestration.core.errors import PermanentProviderError, RetryableProviderError
from orchestration.core.settings import Settings
from orchestration.providers.a2a import A2AProvider, context_id
from orchestration.providers.base import ProviderStatus, TurnRef, TurnRequest, TurnStatus
from tests.conftest import wait_for
from tests.support.a2a_agent import NAME, SKILL, A2AAgent

pytestmark = pytest.mark.integration

#: Loopback, granted explicitly (the default list is empty).
LOOPBACK = "localhost,127.0.0.0/8,::1"
SECRET = "a2a-s3cret-token-5d1f"
TOKEN_ENV = "TEST_A2A_TOKEN"


@pytest.fixture(scope="module")
def agent() -> Iterator[A2AAgent]:
    running = A2AAgent().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def provider() -> A2AProvider:
    settings = Settings(
        provider_timeout=3,
        provider_hosts=LOOPBACK,
        provider_secrets={TOKEN_ENV: ["127.0.0.1"]},
    )
    return A2AProvider(settings)


def turn(
    agent: A2AAgent,
    task: Any = "hello",
    *,
    run: str | None = None,
    attempt: int = 1,
    options: dict[str, Any] | None = None,
    **kw: Any,
) -> TurnRequest:
    run_id = run or uuid.uuid4().hex
    return TurnRequest(
        key=f"{run_id}:step:{attempt}",
        run_id=run_id,
        step_id="step",
        attempt=attempt,
        input=task,
        options=options or {"url": agent.url},
        **kw,
    )


def ref(request: TurnRequest, task_id: str | None) -> TurnRef:
    return TurnRef(request.key, task_id, request.options)


def settled(provider: A2AProvider, where: TurnRef, timeout: float = 10.0) -> tuple[TurnStatus, int]:
    """The first status that is not ``running``, and how many polls it took."""
    polls = 0

    def seen() -> TurnStatus | None:
        nonlocal polls
        polls += 1
        observed = provider.status(where)
        return None if observed.status is ProviderStatus.RUNNING else observed

    return wait_for(seen, timeout, interval=0.05, what="the task settles"), polls


def test_a_task_completes_with_its_artifacts_parts(agent: A2AAgent, provider: A2AProvider) -> None:
    request = turn(agent, "hello")
    task_id = provider.start(request)
    observed, _ = settled(provider, ref(request, task_id))
    assert (observed.status, observed.raw, observed.output) == (
        ProviderStatus.COMPLETED,
        "TASK_STATE_COMPLETED",
        "hello",
    )

    play = {"do": "complete", "text": "done", "data": {"n": 2}, "file": "hi", "file_name": "a.txt"}
    request = turn(agent, play)
    observed, _ = settled(provider, ref(request, provider.start(request)))
    assert observed.output == [
        "done",
        {"n": 2.0},
        {
            "file": {
                "name": "a.txt",
                "media_type": "text/plain",
                # sha256 of b"hi"
                "sha256": "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4",
                "size": 2,
                "base64": "aGk=",
            }
        },
    ]
    snapshot = provider.snapshot(ref(request, None))
    assert snapshot["state"] == "TASK_STATE_COMPLETED"
    assert snapshot["output"] == observed.output
    assert snapshot["context_id"] == context_id(request.key)


def test_a_redelivered_start_makes_one_task(agent: A2AAgent, provider: A2AProvider) -> None:
    request = turn(agent, {"do": "work", "seconds": 1})
    first = provider.start(request)
    again = provider.start(request)
    assert first == again
    assert agent.tasks_in(context_id(request.key)) == [first]
    # The next attempt is a new turn: a task of its own, in a context of its own.
    retry = turn(agent, {"do": "work", "seconds": 1}, run=request.run_id, attempt=2)
    other = provider.start(retry)
    assert other != first
    assert agent.tasks_in(context_id(retry.key)) == [other]
    provider.cancel(ref(request, first))
    provider.cancel(ref(retry, other))


def test_asks_for_input_then_completes_after_the_answer(
    agent: A2AAgent, provider: A2AProvider
) -> None:
    asking = turn(agent, {"do": "ask", "question": "which branch?"})
    task_id = provider.start(asking)
    observed, _ = settled(provider, ref(asking, task_id))
    assert (observed.status, observed.prompt) == (ProviderStatus.INPUT_REQUIRED, "which branch?")

    # The answer is the step's next attempt: a message on the same task, sent once however
    # often the start is delivered.
    answer = turn(agent, run=asking.run_id, attempt=2, resume={"branch": "left"}, resuming=True)
    assert provider.start(answer) == task_id
    assert provider.start(answer) == task_id
    observed, _ = settled(provider, ref(answer, task_id))
    assert (observed.status, observed.output) == (
        ProviderStatus.COMPLETED,
        {"answer": {"branch": "left"}},
    )
    sent = [message for task, _ctx, message in agent.executor.received if task == task_id]
    assert len(sent) == 2, sent
    # Without its task id (a start whose answer was lost), the turn is found by its message.
    assert provider.status(ref(answer, None)).status is ProviderStatus.COMPLETED


def test_a_task_cancelled_mid_way(agent: A2AAgent, provider: A2AProvider) -> None:
    request = turn(agent, {"do": "work"})
    task_id = provider.start(request)
    wait_for(
        lambda: provider.status(ref(request, task_id)).raw == "TASK_STATE_WORKING",
        10,
        what="the task works",
    )
    provider.cancel(ref(request, task_id))
    observed = provider.status(ref(request, task_id))
    assert (observed.status, observed.raw) == (ProviderStatus.CANCELLED, "TASK_STATE_CANCELED")
    assert agent.executor.cancelled.count(task_id) == 1
    # Idempotent: a finished task, or one found by its key, or none at all, is not an error.
    provider.cancel(ref(request, task_id))
    provider.cancel(ref(request, None))
    provider.cancel(ref(turn(agent), None))
    provider.cancel(ref(request, "no-such-task"))


@pytest.mark.parametrize(
    ("play", "expected"),
    [
        ({"do": "fail", "reason": "the model was overloaded"}, "the agent failed the task: "),
        ({"do": "reject", "reason": "not my job"}, "the agent rejected the task: "),
        ({"do": "auth", "reason": "log in first"}, "the agent asks for authentication"),
    ],
)
def test_a_task_that_fails(
    agent: A2AAgent, provider: A2AProvider, play: dict[str, Any], expected: str
) -> None:
    request = turn(agent, play)
    observed, _ = settled(provider, ref(request, provider.start(request)))
    assert observed.status is ProviderStatus.FAILED
    assert (observed.error or "").startswith(expected), observed.error
    assert play["reason"] in (observed.error or "")


def test_an_agent_that_answers_with_a_message_is_refused(
    agent: A2AAgent, provider: A2AProvider
) -> None:
    with pytest.raises(PermanentProviderError, match="answered with a message, not a task"):
        provider.start(turn(agent, {"do": "message"}))


def test_a_task_the_agent_does_not_have_is_a_vanished_turn(
    agent: A2AAgent, provider: A2AProvider
) -> None:
    request = turn(agent)
    with pytest.raises(PermanentProviderError, match="gone from the agent"):
        provider.status(ref(request, "no-such-task"))
    with pytest.raises(PermanentProviderError, match="no task carries turn key"):
        provider.status(ref(request, None))


def test_a_start_past_its_deadline_begins_no_task(agent: A2AAgent, provider: A2AProvider) -> None:
    late = turn(agent, deadline=datetime.now(UTC) - timedelta(seconds=1))
    with pytest.raises(RetryableProviderError, match="deadline passed"):
        provider.start(late)
    assert agent.tasks_in(context_id(late.key)) == []

    # An agent that holds the request past the deadline: the call ends by the deadline.
    agent.hang = 3.0
    try:
        soon = turn(agent, deadline=datetime.now(UTC) + timedelta(seconds=0.5))
        began = time.monotonic()
        with pytest.raises(RetryableProviderError, match="no answer within"):
            provider.start(soon)
        assert time.monotonic() - began < 1.5
    finally:
        agent.hang = 0.0


def test_the_agent_card_is_the_evidence(agent: A2AAgent, provider: A2AProvider) -> None:
    evidence = provider.describe({"url": agent.url, "skill": SKILL})
    assert (evidence.name, evidence.version, dict(evidence.detail)) == (
        NAME,
        "1.0.0",
        {"skill": SKILL},
    )
    with pytest.raises(PermanentProviderError, match="lists no skill 'translate'"):
        provider.describe({"url": agent.url, "skill": "translate"})

    upgraded = A2AAgent(version="2.0.0").start()
    try:
        assert provider.describe({"url": upgraded.url}).version == "2.0.0"
    finally:
        upgraded.stop()


def test_a_secret_header_is_sent_and_never_shown(
    agent: A2AAgent, provider: A2AProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    options = {
        "url": agent.url,
        "headers": {"Authorization": {"secret": TOKEN_ENV, "prefix": "Bearer "}},
    }
    provider.validate(options)
    agent.token = SECRET
    try:
        request = turn(agent, options=options)
        observed, _ = settled(provider, ref(request, provider.start(request)))
        assert observed.output == "hello"
        assert provider.describe(options).name == NAME
        agent.token = "another-token"  # the agent now echoes what it got in its 401
        with pytest.raises(PermanentProviderError) as refused:
            provider.start(turn(agent, options=options))
    finally:
        agent.token = None
    assert "answered 401" in str(refused.value)
    assert "Bearer ***" in str(refused.value)
    assert SECRET not in str(refused.value)


def test_an_agent_that_is_down_is_an_outage(provider: A2AProvider) -> None:
    stopped = A2AAgent().start()
    stopped.stop()
    request = turn(stopped)
    with pytest.raises(RetryableProviderError, match="cannot reach"):
        provider.start(request)
    with pytest.raises(RetryableProviderError):
        provider.status(ref(request, "any"))


def test_the_registry_serves_it(agent: A2AAgent) -> None:
    settings = Settings(provider_hosts=LOOPBACK)
    assert "a2a" in providers.names()
    provider = providers.get_provider("a2a", settings)
    request = turn(agent)
    assert provider.status(ref(request, provider.start(request))).status in (
        ProviderStatus.RUNNING,
        ProviderStatus.COMPLETED,
    )


def test_figures(agent: A2AAgent, provider: A2AProvider) -> None:
    """Medians over a few turns: start to first status, cancel to terminal, a turn's polls
    (polled every 50 ms; the agent works 0.2 s)."""
    first, cancels, polls = [], [], []
    for _ in range(15):
        request = turn(agent, {"do": "complete", "seconds": 0.2})
        began = time.perf_counter()
        task_id = provider.start(request)
        provider.status(ref(request, task_id))
        first.append(time.perf_counter() - began)
        _observed, count = settled(provider, ref(request, task_id))
        polls.append(count + 1)

        working = turn(agent, {"do": "work"})
        working_id = provider.start(working)
        began = time.perf_counter()
        provider.cancel(ref(working, working_id))
        assert provider.status(ref(working, working_id)).status is ProviderStatus.CANCELLED
        cancels.append(time.perf_counter() - began)
    print(
        f"\na2a figures (median of 15): start to first status "
        f"{statistics.median(first) * 1000:.1f} ms; cancel to terminal "
        f"{statistics.median(cancels) * 1000:.1f} ms; polls per turn {statistics.median(polls)}"
    )
