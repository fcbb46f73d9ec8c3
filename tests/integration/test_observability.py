"""Traces and JSON logs from a real worker: spans read from a local OTLP receiver, lines read
from the worker's log, for a completed, a cancelled and a swept run."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from orchestration.core.db import utcnow
from orchestration.observability import otel, tracing
from orchestration.runtime.celery_queue import client_executor
from orchestration.service import Orchestrator
from orchestration.upkeep.sweeper import Sweeper
from tests.conftest import wait_for
from tests.integration.conftest import Stack, make_stack
from tests.support.otlp import Received, Receiver
from tests.support.runs import finished
from tests.unit.support import steps_of

pytestmark = pytest.mark.integration
#: The running steps' poll interval: long enough to cancel between two executions.
POLL_INTERVAL = 0.5


def step(states: list[list[Any]], name: str, poll_interval: float = 0.1) -> dict[str, Any]:
    return {
        "id": name,
        "provider": "scripted",
        "task": "go",
        "poll_interval": poll_interval,
        "max_poll_interval": poll_interval,
        "with": {"states": states},
    }


@pytest.fixture(scope="module")
def otlp() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def traced(
    otlp: Receiver, broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A stack whose worker logs JSON and exports spans to ``otlp``; this process (the API
    side: launch, cancel, an in-process sweep) exports there too."""
    name = f"orch_observability_{uuid.uuid4().hex[:6]}"
    overrides = {
        "ORCH_LOG_FORMAT": "json",
        "ORCH_OTEL_ENDPOINT": otlp.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    stack, drop = make_stack(tmp_path_factory.mktemp(name), broker_url, name, overrides)
    exporter = OTLPSpanExporter(endpoint=otlp.url + tracing.TRACES_PATH)
    with tracing.installed(otel.Tracing(SimpleSpanProcessor(exporter), "orchestration-api")):
        stack.start_worker()
        yield stack
        stack.stop()
    if drop is not None:
        drop()


def _cancel_between_polls(stack: Stack, orch: Orchestrator, run_id: str, owner: str) -> None:
    """Cancel once the run's step is well between two executions (its last fence at least a
    quarter of the poll interval ago, and not yet half of it). A revoke that lands during an
    execution kills the pool process (``ORCH_REVOKE_SIGNAL=SIGKILL``), and with it the spans
    that process had not exported yet, of any run: a documented limit (docs/operations.md,
    "Traces"), not what these assertions are about."""
    interval = POLL_INTERVAL

    def between() -> bool:
        since = (utcnow() - steps_of(stack.settings, run_id)[0].updated_at).total_seconds()
        return interval / 4 <= since <= interval / 2

    wait_for(between, 15, interval=0.01, what="a moment between two polls")
    assert orch.cancel(run_id, owner=owner).status == "cancelled"


def _one(spans: list[Received], name: str) -> Received:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, (name, spans)
    return found[0]


def _joined(spans: list[Received], run_id: str) -> Received:
    """Every span of the run's trace has its parent in the trace; the launch is the root,
    with the id every process derives from the run id."""
    launch = _one(spans, "run.launch")
    assert (launch.span_id, launch.parent_id) == (f"{otel.launch_span_id(run_id):016x}", "")
    ids = {span.span_id for span in spans}
    assert all(span.parent_id in ids for span in spans if span is not launch), spans
    return launch


def test_each_run_is_one_trace_and_its_worker_lines_carry_its_id(
    traced: Stack, otlp: Receiver
) -> None:
    orch = Orchestrator(traced.settings, client_executor(traced.settings).queue)
    owner = f"owner-{uuid.uuid4().hex[:8]}"
    done = orch.launch(
        {"name": "two", "steps": [step([["completed"]], "a"), step([["completed"]], "b")]},
        owner=owner,
    )
    running = step([["running"]], "s", POLL_INTERVAL)
    cancelled = orch.launch({"name": "c", "steps": [running]}, owner=owner)
    swept = orch.launch({"name": "w", "steps": [running]}, owner=owner)
    assert finished(orch, done.id, owner).status == "completed"
    wait_for(lambda: orch.get(cancelled.id, owner=owner).steps[0].polls >= 2, 15, what="polls")
    _cancel_between_polls(traced, orch, cancelled.id, owner)
    wait_for(lambda: orch.get(swept.id, owner=owner).steps[0].polls >= 1, 15, what="a poll")
    # The sweeper, judging at a later instant, finds the swept run's heartbeat dead: re-arm.
    # A poll that stamps the run between a pass's read and its compare-and-set makes that
    # pass leave the run alone, by design (it is alive); a later pass re-arms it.
    sweeper = Sweeper(traced.settings, client_executor(traced.settings))

    def rearmed() -> dict[str, Any] | None:
        later = utcnow() + timedelta(seconds=traced.settings.heartbeat_timeout * 2)
        report = sweeper.sweep(now=later)
        return report if report["rearmed"] == 1 else None

    wait_for(rearmed, 10, interval=0.01, what="a pass that re-arms the swept run")

    def rearmed_execution() -> list[Received] | None:
        spans = otlp.of_trace(swept.id)
        sweep = [span for span in spans if span.name == "sweeper.rearmed"]
        after = [s for s in spans if sweep and s.parent_id == sweep[0].span_id]
        return spans if any(s.name == "step.execute" for s in after) else None

    wait_for(rearmed_execution, 15, what="a step execution sent by the sweeper")
    _cancel_between_polls(traced, orch, swept.id, owner)

    # The completed run: the launch, two steps, each step's first execution a child of the
    # execution (or launch) that sent it, and provider calls inside the executions.
    spans = wait_for(
        lambda: (
            (s := otlp.of_trace(done.id))
            and sum(span.name == "provider.start" for span in s) == 2
            and s
        ),
        10,
        what="the completed run's spans",
    )
    launch = _joined(spans, done.id)
    assert (
        launch.attributes["orchestration.owner"] == owner and launch.service == "orchestration-api"
    )
    executions = {s.span_id: s for s in spans if s.name == "step.execute"}
    assert {s.attributes["orchestration.step_index"] for s in executions.values()} == {0, 1}
    first_b = [s for s in executions.values() if s.attributes["orchestration.step_id"] == "b"]
    assert executions[first_b[0].parent_id].attributes["orchestration.step_id"] == "a"
    assert all(s.service == "orchestration-worker" for s in executions.values())
    assert all(s.attributes["orchestration.attempt"] == 1 for s in executions.values())
    for call in (s for s in spans if s.name.startswith("provider.")):
        assert call.parent_id in executions, call

    # The cancelled run: the cancel (this process) under the launch, its provider cancel in it.
    spans = wait_for(lambda: (s := otlp.of_trace(cancelled.id)) and s, 5, what="cancel spans")
    launch = _joined(spans, cancelled.id)
    cancel = _one(spans, "run.cancel")
    assert cancel.parent_id == launch.span_id
    assert _one(spans, "provider.cancel").parent_id == cancel.span_id

    # The swept run: the sweeper's action under the launch, acted.
    spans = otlp.of_trace(swept.id)
    sweep = _one(spans, "sweeper.rearmed")
    assert sweep.attributes["orchestration.acted"] is True
    assert sweep.parent_id == _joined(spans, swept.id).span_id

    # One trace per run: every span naming a run is in the trace of that run.
    for span in otlp.spans:
        run_id = span.attributes.get("orchestration.run_id")
        assert run_id is None or span.trace_id == run_id, span

    # The worker's log: JSON from its first log line on; the run's lines carry its id.
    text = (traced.folder / "w.log").read_text()
    lines = text[text.index("\n{") + 1 :].splitlines()
    records = [json.loads(line) for line in lines]
    mine = [r for r in records if r.get("run_id") == done.id]
    assert {r["logger"] for r in mine} >= {"celery.app.trace"}, records[-20:]
    assert all(r["task_id"] and r["step_index"] in (0, 1) for r in mine)
