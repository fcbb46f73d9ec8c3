"""The langgraph provider against a real ``langgraph dev`` server: no mocks.

The graphs live in ``tests/langgraph_app``. The server is shared by the module; the crash test
kills and restarts it, so it runs last.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from orchestration import providers
from orchestration.core.errors import (
    PermanentProviderError,
    RetryableProviderError,
    ValidationError,
)
from orchestration.core.settings import Settings
from orchestration.providers.base import ProviderStatus, TurnRef, TurnRequest, TurnStatus
from orchestration.providers.langgraph import KEY_FIELD, LangGraphProvider, thread_id
from tests.support.langgraph_server import LangGraphServer, available

pytestmark = pytest.mark.integration

if not available() and os.environ.get("CI") != "true":
    pytest.skip(
        "langgraph-cli[inmem] is not installed (pip install 'langgraph-cli[inmem]')",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LangGraphServer]:
    if not available():
        pytest.fail("CI=true but langgraph-cli[inmem] is not installed: the CI setup must add it")
    running = LangGraphServer(tmp_path_factory.mktemp("langgraph"))
    running.start()
    yield running
    running.stop()


#: Loopback, granted explicitly (the default list is empty).
LOOPBACK = "localhost,127.0.0.0/8,::1"


@pytest.fixture(scope="module")
def provider() -> LangGraphProvider:
    # The API key may go to the loopback dev server only.
    settings = Settings(
        provider_timeout=5,
        provider_hosts=LOOPBACK,
        provider_secrets={"TEAM_LANGGRAPH_KEY": ["127.0.0.1"]},
    )
    return LangGraphProvider(settings)


def options(server: LangGraphServer, graph: str, **extra: Any) -> dict[str, Any]:
    return {"url": server.url, "assistant_id": graph, **extra}


def turn(
    opts: dict[str, Any],
    task: Any = "hello",
    *,
    run: str | None = None,
    attempt: int = 1,
    **kw: Any,
) -> TurnRequest:
    run_id = run or uuid.uuid4().hex
    key = f"{run_id}:step:{attempt}"
    return TurnRequest(
        key=key, run_id=run_id, step_id="step", attempt=attempt, input=task, options=opts, **kw
    )


def ref(request: TurnRequest, run_id: str | None) -> TurnRef:
    return TurnRef(key=request.key, provider_run_id=run_id, options=request.options)


def poll_until(
    observe: Callable[[], TurnStatus], done: Callable[[TurnStatus], bool], within: float = 15.0
) -> TurnStatus:
    deadline = time.monotonic() + within
    while True:
        seen = observe()
        if done(seen) or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def settled(status: TurnStatus) -> bool:
    return status.status not in (ProviderStatus.PENDING, ProviderStatus.RUNNING)


def test_registered_and_validates(server: LangGraphServer) -> None:
    provider = providers.get_provider("langgraph", Settings(provider_hosts=LOOPBACK))
    assert provider.name == "langgraph"
    provider.validate(options(server, "answer", input={"messages": []}, config={}))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"assistant_id": "answer"}, "url"),
        ({"url": "localhost:2024", "assistant_id": "answer"}, "url"),
        ({"url": server.url}, "assistant_id"),
        (options(server, "answer", input="text"), "input"),
        (options(server, "answer", config=[1]), "config"),
        (options(server, "answer", api_key="literal"), "api_key"),
        (options(server, "answer", api_key_env="TEAM_LANGGRAPH_KEY"), "api_key_env"),
        ({"url": "http://10.1.2.3:2024", "assistant_id": "answer"}, "url"),
    ]
    for opts, field in cases:
        with pytest.raises(ValidationError) as caught:
            provider.validate(opts)
        assert caught.value.field == field


def test_turn_completes_with_the_graphs_answer(
    server: LangGraphServer, provider: LangGraphProvider
) -> None:
    request = turn(options(server, "answer"), "ship it")
    run_id = provider.start(request)
    final = poll_until(lambda: provider.status(ref(request, run_id)), settled)
    assert final == TurnStatus(
        ProviderStatus.COMPLETED, raw="success/idle", output={"answer": 42, "task": "ship it"}
    )
    snapshot = provider.snapshot(ref(request, run_id))
    assert snapshot["thread_id"] == thread_id(request.key)
    assert snapshot["output"] == {"answer": 42, "task": "ship it"}
    assert [m["type"] for m in snapshot["values"]["messages"]] == ["human", "ai"]


def test_input_template_config_and_api_key(
    server: LangGraphServer, provider: LangGraphProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAM_LANGGRAPH_KEY", "lg-key-not-checked-by-dev-server")
    opts = options(
        server,
        "answer",
        input={"messages": [{"role": "user", "content": "task: {task}"}]},
        config={"configurable": {"delay": 0}},
        api_key_env="TEAM_LANGGRAPH_KEY",
    )
    request = turn(opts, "templated")
    run_id = provider.start(request)
    final = poll_until(lambda: provider.status(ref(request, run_id)), settled)
    assert final.output == {"answer": 42, "task": "task: templated"}


def test_interrupt_is_input_required_and_resume_completes(
    server: LangGraphServer, provider: LangGraphProvider
) -> None:
    first = turn(options(server, "ask"), "deploy")
    run_id = provider.start(first)
    asked = poll_until(lambda: provider.status(ref(first, run_id)), settled)
    assert asked == TurnStatus(
        ProviderStatus.INPUT_REQUIRED,
        raw="success/interrupted",
        prompt={"question": "approve deploy?"},
    )
    resume = turn(first.options, "deploy", run=first.run_id, attempt=2, resume="yes", resuming=True)
    resumed_id = provider.start(resume)
    assert resumed_id != run_id
    final = poll_until(lambda: provider.status(ref(resume, resumed_id)), settled)
    assert final == TurnStatus(
        ProviderStatus.COMPLETED, raw="success/idle", output="human said: yes"
    )


def test_raised_error_fails_the_turn_with_its_text(
    server: LangGraphServer, provider: LangGraphProvider
) -> None:
    request = turn(options(server, "fail"), "boom")
    run_id = provider.start(request)
    final = poll_until(lambda: provider.status(ref(request, run_id)), settled)
    assert final == TurnStatus(
        ProviderStatus.FAILED, raw="error", error="ValueError: deliberate failure for boom"
    )


def test_cancel_interrupts_the_server_side_run(
    server: LangGraphServer, provider: LangGraphProvider
) -> None:
    slow = options(server, "answer", config={"configurable": {"delay": 60}})
    request = turn(slow)
    run_id = provider.start(request)
    poll_until(lambda: provider.status(ref(request, run_id)), lambda s: s.raw == "running")
    provider.cancel(ref(request, run_id))
    final = poll_until(lambda: provider.status(ref(request, run_id)), settled)
    assert final == TurnStatus(ProviderStatus.CANCELLED, raw="interrupted")
    provider.cancel(ref(request, run_id))

    # A start that crashed before recording its run id: cancel finds the run by its key.
    unrecorded = turn(slow)
    unrecorded_id = provider.start(unrecorded)
    provider.cancel(ref(unrecorded, None))
    final = poll_until(lambda: provider.status(ref(unrecorded, None)), settled)
    assert final.status is ProviderStatus.CANCELLED
    assert provider.status(ref(unrecorded, unrecorded_id)).raw == "interrupted"
    provider.cancel(ref(turn(slow), None))


def test_start_twice_with_one_key_is_one_run(
    server: LangGraphServer, provider: LangGraphProvider
) -> None:
    request = turn(options(server, "answer", config={"configurable": {"delay": 1}}))
    first = provider.start(request)
    assert provider.start(request) == first
    poll_until(lambda: provider.status(ref(request, first)), settled)
    assert provider.start(request) == first, "a redelivered start after the run finished"
    runs = httpx.get(f"{server.url}/threads/{thread_id(request.key)}/runs", timeout=5).json()
    assert [(r["run_id"], r["metadata"][KEY_FIELD]) for r in runs] == [(first, request.key)]


def test_racing_starts_with_one_key_are_one_run(
    server: LangGraphServer, provider: LangGraphProvider
) -> None:
    request = turn(options(server, "answer", config={"configurable": {"delay": 2}}))
    with ThreadPoolExecutor(max_workers=4) as pool:
        run_ids = set(pool.map(lambda _: provider.start(request), range(4)))
    assert len(run_ids) == 1
    runs = httpx.get(f"{server.url}/threads/{thread_id(request.key)}/runs", timeout=5).json()
    assert [r["run_id"] for r in runs] == list(run_ids)
    provider.cancel(ref(request, None))


def test_next_attempt_waits_while_the_last_one_holds_the_thread(
    server: LangGraphServer, provider: LangGraphProvider
) -> None:
    slow = options(server, "answer", config={"configurable": {"delay": 60}})
    first = turn(slow)
    first_id = provider.start(first)
    retry = turn(options(server, "answer"), run=first.run_id, attempt=2)
    with pytest.raises(RetryableProviderError, match="busy with another run"):
        provider.start(retry)
    provider.cancel(ref(first, first_id))
    poll_until(lambda: provider.status(ref(first, first_id)), settled)
    retry_id = provider.start(retry)
    final = poll_until(lambda: provider.status(ref(retry, retry_id)), settled)
    assert final.status is ProviderStatus.COMPLETED


def test_vanished_run_is_permanent(server: LangGraphServer, provider: LangGraphProvider) -> None:
    request = turn(options(server, "answer"))
    provider.start(request)
    with pytest.raises(PermanentProviderError, match="gone from the server"):
        provider.status(ref(request, str(uuid.uuid4())))


def test_server_crash_is_an_outage_then_the_turn_finishes_or_vanishes(
    server: LangGraphServer, provider: LangGraphProvider
) -> None:
    request = turn(options(server, "answer", config={"configurable": {"delay": 1.5}}))
    run_id = provider.start(request)
    poll_until(lambda: provider.status(ref(request, run_id)), lambda s: s.raw == "running")
    server.kill()
    with pytest.raises(RetryableProviderError, match="cannot reach"):
        provider.status(ref(request, run_id))
    server.start()

    # Saved (every ~10 s) before the kill: re-run from the node's start. Not saved: gone.
    def observe() -> TurnStatus:
        try:
            return provider.status(ref(request, run_id))
        except PermanentProviderError as exc:
            assert "gone from the server" in str(exc)
            return TurnStatus(ProviderStatus.FAILED, raw="vanished")

    final = poll_until(observe, settled)
    assert final.raw in ("success/idle", "vanished"), final
    if final.raw == "success/idle":
        assert final.output == {"answer": 42, "task": "hello"}


def test_describe_names_the_assistant_and_its_version(
    server: LangGraphServer, provider: LangGraphProvider
) -> None:
    # A graph name reads the graph's assistant; its id then reads the same one directly.
    by_graph = provider.describe(options(server, "answer"))
    assert by_graph.detail["graph_id"] == "answer"
    assert by_graph.version is not None and by_graph.name
    assistant = str(by_graph.detail["assistant_id"])
    by_id = provider.describe(options(server, assistant))
    assert (by_id.name, by_id.version, by_id.detail) == (
        by_graph.name,
        by_graph.version,
        by_graph.detail,
    )
    with pytest.raises(PermanentProviderError, match="no assistant or graph 'nothing-here'"):
        provider.describe(options(server, "nothing-here"))
