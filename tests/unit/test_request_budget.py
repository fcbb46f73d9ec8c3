"""Every request a worker builds is bounded before it is built (``ORCH_MAX_REQUEST_BYTES``).

The issue's example is a 240 KB launch that made a worker build a 7.2 GB body: an ``http``
step whose ``body`` names ``{task}`` 30,000 times, with a 240,000-byte task. Here it is
refused at launch, and, launched under settings that let it through, its start fails fast,
``over_limit``, naming the setting, with the worker's memory growing by less than the budget
and nothing sent. The rendering itself is checked against the plain fill it replaced.
"""

from __future__ import annotations

import json
import re
import socket
import time
import tracemalloc
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestration.core.db import utcnow
from orchestration.core.errors import LimitExceeded, RequestOverLimit, ValidationError
from orchestration.core.settings import Settings
from orchestration.execution import Halt, Stepper
from orchestration.providers.base import TurnRequest
from orchestration.providers.http import HttpProvider
from orchestration.providers.langgraph import LangGraphProvider
from orchestration.providers.request_budget import (
    CHUNK_BYTES,
    MAX_PLACEHOLDERS,
    RequestBudget,
    Verbatim,
    fill_body,
    fill_url,
)
from orchestration.runs import effects
from orchestration.runtime.executor import Executor
from orchestration.workflows import parsing
from tests.unit.support import (
    PROPERTY,
    Clock,
    drive,
    launch,
    run_row,
    step_spec,
    steps_of,
    workflow,
)

BUDGET = 1048576
TASK = "t" * 240_000
LOOPBACK = "localhost,127.0.0.0/8,::1"


@pytest.fixture(autouse=True)
def no_connections(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every refusal here comes before any lookup or connection."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise AssertionError(f"a connection was attempted: {args!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


def http_options(body: Any, base: str = "http://127.0.0.1:9") -> dict[str, Any]:
    return {
        "start": {"url": f"{base}/runs", "body": body},
        "status": {"url": f"{base}/runs/{{run_id}}"},
        "cancel": {"url": f"{base}/runs/{{run_id}}/cancel"},
        "run_id_path": "id",
        "status_path": "state",
    }


def turn(options: Mapping[str, Any], task: Any = TASK) -> TurnRequest:
    return TurnRequest("run-1:a:1", "run-1", "a", 1, task, options)


@pytest.fixture
def clock() -> Clock:
    return Clock(utcnow())


# --- the example -------------------------------------------------------------------


def bomb(body: Any) -> dict[str, Any]:
    step = {"id": "a", "provider": "http", "task": "{{ args.t }}", "with": http_options(body)}
    return {"name": "bomb", "steps": [step]}


def test_the_7_gb_body_is_refused_at_launch_naming_the_setting() -> None:
    settings = Settings(provider_hosts=LOOPBACK)
    # As the issue wrote it, its options alone are over their bound.
    with pytest.raises(LimitExceeded) as caught:
        parsing.parse(bomb(["{task}"] * 30_000), settings, args={"t": "x"})
    assert caught.value.field == "steps[0].with"
    assert "ORCH_MAX_OPTIONS_BYTES" in caught.value.problem
    # Within them, its placeholders times the task's bound are over the request's.
    with pytest.raises(LimitExceeded) as caught:
        parsing.parse(bomb(["{task}"] * 5), settings, args={"t": "x"})
    assert caught.value.field == "steps[0].with.start"
    assert "names {task} 5 times" in caught.value.problem
    assert "ORCH_MAX_REQUEST_BYTES" in caught.value.problem
    parsing.parse(bomb(["{task}"] * 3), settings, args={"t": "x"})


def test_the_7_gb_body_fails_fast_and_builds_less_than_the_budget(
    no_connections: list[Any],
) -> None:
    provider = HttpProvider(Settings(provider_hosts=LOOPBACK))
    request = turn(http_options(["{task}"] * 30_000))
    tracemalloc.start()
    began = time.perf_counter()
    try:
        with pytest.raises(RequestOverLimit) as caught:
            provider.start(request)
        elapsed = time.perf_counter() - began
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "ORCH_MAX_REQUEST_BYTES" in str(caught.value)
    assert caught.value.code == "over_limit"
    assert elapsed < 1.0
    # The task's JSON is encoded once (240 KB) and referenced; the 7.2 GB are never built.
    assert peak < BUDGET, peak
    assert no_connections == []


def test_a_request_that_fits_is_built_whole_and_one_byte_more_is_not() -> None:
    budget = RequestBudget(2000, "test")
    body = bytes(fill_body({"q": "{task}", "n": [1, 2]}, {"task": "x" * 100}, budget))
    assert json.loads(body) == {"q": "x" * 100, "n": [1, 2]}
    assert budget.used == len(body)
    exact = RequestBudget(len(body), "test")
    assert bytes(fill_body({"q": "{task}", "n": [1, 2]}, {"task": "x" * 100}, exact)) == body
    with pytest.raises(RequestOverLimit):
        fill_body(
            {"q": "{task}", "n": [1, 2]}, {"task": "x" * 100}, RequestBudget(len(body) - 1, "t")
        )


def test_a_start_over_its_budget_fails_the_step_over_limit_and_sends_nothing(
    settings_factory: Callable[..., Settings], clock: Clock, no_connections: list[Any]
) -> None:
    """Launched under settings that let three ``{task}`` through, run by a worker whose
    budget is smaller (the operator lowered it since): the step fails ``over_limit``."""
    settings = settings_factory()
    body = {"a": "{task}", "b": "{task}", "c": "{task}"}
    definition = workflow(step_spec(provider="http", task="{{ args.t }}", with_=http_options(body)))
    run_id = launch(settings, definition, {"t": "y" * 3000}, now=clock())
    worker = settings.model_copy(update={"max_request_bytes": 8192})
    outcomes = drive(Stepper(worker, Executor(worker, None), clock=clock), run_id)
    assert outcomes[-1] == Halt("provider refused the turn")
    run = run_row(settings, run_id)
    assert (run.status, run.stop_reason) == ("failed", "over_limit")
    assert run.error is not None and "ORCH_MAX_REQUEST_BYTES" in run.error
    assert steps_of(settings, run_id)[0].provider_run_id is None
    assert no_connections == []


def test_langgraph_input_is_bounded_at_launch_and_while_rendering(
    no_connections: list[Any],
) -> None:
    settings = Settings(provider_hosts=LOOPBACK)
    provider = LangGraphProvider(settings)
    many = {"url": "http://127.0.0.1:9", "assistant_id": "a", "input": {"q": ["{task}"] * 5}}
    with pytest.raises(LimitExceeded, match="ORCH_MAX_REQUEST_BYTES") as caught:
        provider.validate(many)
    assert caught.value.field == "input"
    small = settings.model_copy(update={"max_request_bytes": 4096})
    few = {**many, "input": {"q": ["{task}"] * 3}}
    with pytest.raises(RequestOverLimit, match="ORCH_MAX_REQUEST_BYTES"):
        LangGraphProvider(small).start(turn(few, "z" * 2000))
    assert no_connections == []


def test_the_webhook_is_bounded_too(no_connections: list[Any]) -> None:
    settings = Settings(webhook_url="http://127.0.0.1:9/hook")
    small = settings.model_copy(update={"max_request_bytes": 4096})
    payload = {"run_id": "r", "owner": "o", "step_id": "a", "attempt": 1, "output": "o" * 5000}
    with pytest.raises(RequestOverLimit, match="ORCH_MAX_REQUEST_BYTES"):
        effects._post_webhook(small, payload)
    assert no_connections == []


# --- launch-time bounds on the templates ---------------------------------------------------


def test_with_options_are_bounded_at_launch() -> None:
    settings = Settings(provider_hosts=LOOPBACK)
    definition = {
        "name": "big",
        "steps": [
            {"id": "a", "provider": "scripted", "with": {"output": "o" * 70_000}, "task": "t"}
        ],
    }
    with pytest.raises(LimitExceeded) as caught:
        parsing.parse(definition, settings)
    assert caught.value.field == "steps[0].with"
    assert "ORCH_MAX_OPTIONS_BYTES" in caught.value.problem


def test_placeholders_are_counted_at_launch() -> None:
    provider = HttpProvider(Settings(provider_hosts=LOOPBACK))
    # The status and cancel URLs hold one {run_id} each.
    provider.validate(http_options({"k": ["{key}"] * (MAX_PLACEHOLDERS - 2)}))
    with pytest.raises(LimitExceeded, match=f"over {MAX_PLACEHOLDERS} placeholders") as caught:
        provider.validate(http_options({"k": ["{key}"] * (MAX_PLACEHOLDERS - 1)}))
    assert caught.value.field == "cancel"
    deep: Any = "{task}"
    for _ in range(40):
        deep = [deep]
    with pytest.raises(ValidationError, match="nested deeper"):
        provider.validate(http_options(deep))


# --- the rendering is the fill it replaced -------------------------------------------------


def reference_fill(template: Any, values: Mapping[str, Any]) -> Any:
    """The fill ``providers/http.py`` had before the budget (the oracle)."""
    if isinstance(template, str):
        if not values:
            return template
        pattern = re.compile("{(" + "|".join(re.escape(name) for name in values) + ")}")
        whole = pattern.fullmatch(template)
        if whole:
            return values[whole.group(1)]

        def text(match: re.Match[str]) -> str:
            value = values[match.group(1)]
            return value if isinstance(value, str) else json.dumps(value)

        return pattern.sub(text, template)
    if isinstance(template, list):
        return [reference_fill(item, values) for item in template]
    if isinstance(template, dict):
        return {key: reference_fill(item, values) for key, item in template.items()}
    return template


_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_PIECE = st.sampled_from(["{task}", "{key}", "{other}", "{", "}", "é", '"', "\\", "\n"])
_TEMPLATE_TEXT = st.lists(_TEXT | _PIECE, max_size=6).map("".join)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=12,
)
_TEMPLATE = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEMPLATE_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=12,
)


@PROPERTY
@given(template=_TEMPLATE, task=_JSON, key=_TEXT)
def test_the_body_is_the_plain_fill_sent_as_httpx_sends_json(
    template: Any, task: Any, key: str
) -> None:
    values = {"task": task, "key": key}
    expected = json.dumps(
        reference_fill(template, values), ensure_ascii=False, separators=(",", ":")
    ).encode()
    budget = RequestBudget(10**7, "test")
    assert bytes(fill_body(template, values, budget)) == expected
    assert budget.used == len(expected)


@PROPERTY
@given(template=_TEMPLATE_TEXT, run_id=_TEXT)
def test_the_url_is_the_plain_fill_of_percent_encoded_values(template: str, run_id: str) -> None:
    from urllib.parse import quote

    values = {"run_id": run_id, "key": "r:a:1"}
    quoted = {name: quote(str(value), safe="") for name, value in values.items()}
    budget = RequestBudget(10**6, "test")
    assert fill_url(template, values, budget) == reference_fill(template, quoted)
    assert budget.used == len(fill_url(template, values, RequestBudget(10**6, "t")).encode())


def test_verbatim_parts_are_never_filled() -> None:
    body = fill_body(
        {"id": Verbatim("{task}"), "input": "{task}"}, {"task": "filled"}, RequestBudget(100, "t")
    )
    assert json.loads(bytes(body)) == {"id": "{task}", "input": "filled"}


def test_a_body_goes_out_in_bounded_chunks_without_being_joined() -> None:
    task = "v" * 200_000
    body = fill_body(
        ["{task}", "{task}", {"k": "{task}"}], {"task": task}, RequestBudget(10**6, "t")
    )
    encoded = body.pieces[1]
    assert sum(piece is encoded for piece in body.pieces) == 3, "encoded once, referenced"
    chunks = list(body)
    assert max(map(len, chunks)) <= CHUNK_BYTES
    assert b"".join(chunks) == bytes(body) and sum(map(len, chunks)) == body.size
    assert list(body) == chunks, "it can be sent again"
