"""JSON log lines and run traces, in process: the formatter reading the context, the
endpoint rules, and the spans of a launch, a step execution and a cancel through the real
domain, read from the SDK's in-memory exporter."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestration import observability
from orchestration.core.errors import ConfigurationError
from orchestration.core.settings import Settings
from orchestration.execution import Stepper
from orchestration.observability import context, logs, otel, tracing
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from tests.unit.support import step_spec, workflow


def _line(formatter: logging.Formatter, message: str, *, error: bool = False) -> dict[str, object]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.Logger("orchestration.test")
    logger.addHandler(handler)
    if error:
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception(message)
    else:
        logger.warning("%s %d", message, 7)
    parsed: dict[str, object] = json.loads(stream.getvalue())
    return parsed


def test_a_json_line_carries_what_the_context_knows_and_only_inside_its_scope() -> None:
    formatter = logs.JsonFormatter(lambda: {"task_name": "t", "task_id": "from-celery"})
    with context.scope(run_id="r1", step_index=1, task_id="task-1", attempt=None):
        context.bind(step_id="research", attempt=2)
        inside = _line(formatter, "polled")
    after = _line(formatter, "idle")
    context.bind(step_id="outside any scope")
    assert context.fields() == {}
    assert inside["message"] == "polled 7"
    assert (inside["level"], inside["logger"]) == ("WARNING", "orchestration.test")
    assert str(inside["time"]).endswith("+00:00")
    # The context wins over the host's fields; None values are left out.
    assert {k: inside[k] for k in ("run_id", "step_id", "step_index", "attempt", "task_id")} == {
        "run_id": "r1",
        "step_id": "research",
        "step_index": 1,
        "attempt": 2,
        "task_id": "task-1",
    }
    assert "run_id" not in after and after["task_id"] == "from-celery"


def test_a_json_line_keeps_the_traceback() -> None:
    line = _line(logs.JsonFormatter(), "failed", error=True)
    assert "ValueError: boom" in str(line["exc_info"])


def test_configure_json_gives_the_root_logger_one_json_handler() -> None:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    try:
        logs.configure("text")
        assert root.handlers == saved
        logs.configure("json", logging.INFO)
        (handler,) = root.handlers
        assert isinstance(handler.formatter, logs.JsonFormatter)
        assert root.level == logging.INFO
    finally:
        root.handlers, root.level = saved, level


@pytest.mark.parametrize(
    ("orch", "environ", "expected"),
    [
        (None, {}, None),
        ("http://127.0.0.1:4318/", {}, "http://127.0.0.1:4318/v1/traces"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://c:4318/v1/traces"),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/t"}, "http://c/t"),
        (None, {"OTEL_TRACES_EXPORTER": "otlp"}, tracing.DEFAULT_ENDPOINT),
        ("http://c", {"OTEL_TRACES_EXPORTER": "none"}, None),
        ("http://c", {"OTEL_SDK_DISABLED": "true"}, None),
    ],
)
def test_traces_are_off_unless_an_endpoint_is_configured(
    orch: str | None, environ: dict[str, str], expected: str | None
) -> None:
    settings = Settings(otel_endpoint=orch)
    assert tracing.endpoint(settings, environ) == expected


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
)
def test_an_otel_endpoint_that_is_not_a_web_url_names_its_variable(variable: str) -> None:
    # ``ORCH_OTEL_ENDPOINT`` is refused when the settings load (test_settings_garbage).
    with pytest.raises(ConfigurationError, match=variable):
        tracing.endpoint(Settings(), {variable: "127.0.0.1:4318"})


def test_a_configured_endpoint_without_the_extra_warns_and_traces_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # As if the ``otel`` extra were not installed: the import fails.
    monkeypatch.setitem(sys.modules, "orchestration.observability.otel", None)
    monkeypatch.delattr(observability, "otel")
    assert tracing.setup(Settings(otel_endpoint="http://127.0.0.1:9"), "t") is False
    assert "orchestration[otel]" in caplog.text
    with tracing.run_span("0" * 32, "step.execute"):
        tracing.annotate({"a": 1})


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    with tracing.installed(otel.Tracing(SimpleSpanProcessor(exporter), "unit")):
        yield exporter


def _named(finished: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in finished if span.name == name]


def test_a_run_is_one_trace_whose_root_is_its_launch(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    orch = Orchestrator(settings, None)
    run = orch.launch(workflow(step_spec(with_={"states": [["running"]]})), owner="acme")
    # What the step task's hook does: the execution's span, in the run's trace.
    with tracing.run_span(run.id, "step.execute", step_index=0):
        Stepper(settings, Executor(settings, None)).advance(run.id, 0, 0)
    orch.cancel(run.id, owner="acme")
    assert (
        orch.launch(workflow(), owner="acme", request_id="r").id
        == orch.launch(workflow(), owner="acme", request_id="r").id
    )

    finished = spans.get_finished_spans()
    mine = [span for span in finished if span.context.trace_id == int(run.id, 16)]
    launch = _named(finished, "run.launch")[0]
    assert launch.context.span_id == otel.launch_span_id(run.id) and launch.parent is None
    assert launch.attributes is not None and launch.attributes["orchestration.owner"] == "acme"
    (execution,) = _named(finished, "step.execute")
    assert execution.parent is not None and execution.parent.span_id == launch.context.span_id
    assert execution.attributes is not None
    assert execution.attributes["orchestration.step_id"] == "a"
    assert execution.attributes["orchestration.attempt"] == 1
    for name in ("provider.start", "provider.status"):
        (call,) = _named(finished, name)
        assert call.parent is not None and call.parent.span_id == execution.context.span_id
    (cancel,) = _named(finished, "run.cancel")
    assert cancel.parent is not None and cancel.parent.span_id == launch.context.span_id
    (stop,) = _named(finished, "provider.cancel")
    assert stop.parent is not None and stop.parent.span_id == cancel.context.span_id
    assert {span.name for span in mine} == {
        "run.launch",
        "step.execute",
        "provider.start",
        "provider.status",
        "run.cancel",
        "provider.cancel",
    }
    # The second launch with the same request id found the run: no second root span.
    assert len(_named(finished, "run.launch")) == 2


def test_a_message_carries_the_span_that_sent_it(spans: InMemorySpanExporter) -> None:
    run_id, other = "a" * 32, "b" * 32
    headers: dict[str, str] = {}
    with tracing.run_span(run_id, "step.execute"):
        tracing.inject(headers)
    foreign: dict[str, str] = {}
    with tracing.run_span(other, "step.execute"):
        tracing.inject(foreign)
    with tracing.run_span(run_id, "next", carrier=headers), tracing.span("provider.status"):
        pass
    with tracing.run_span(run_id, "elsewhere", carrier=foreign):
        pass
    with tracing.span("outside any run"):
        pass
    by_name = {span.name: span for span in spans.get_finished_spans()}
    sender = next(
        s
        for s in spans.get_finished_spans()
        if s.name == "step.execute" and s.context.trace_id == int(run_id, 16)
    )
    assert headers["traceparent"].split("-")[1] == run_id
    assert by_name["next"].parent is not None
    assert by_name["next"].parent.span_id == sender.context.span_id
    assert by_name["provider.status"].parent is not None
    assert by_name["provider.status"].parent.span_id == by_name["next"].context.span_id
    # A header from another trace is not this run's parent: the launch is.
    assert by_name["elsewhere"].parent is not None
    assert by_name["elsewhere"].parent.span_id == otel.launch_span_id(run_id)
    assert by_name["elsewhere"].context.trace_id == int(run_id, 16)
    assert [link.context.trace_id for link in by_name["elsewhere"].links] == [int(other, 16)]
    assert "outside any run" not in by_name


def test_a_run_id_that_is_not_hex_still_maps_to_one_trace() -> None:
    assert otel.trace_id_of("run-1") == otel.trace_id_of("run-1") != otel.trace_id_of("run-2")
    assert otel.trace_id_of("f" * 32) == int("f" * 32, 16)
