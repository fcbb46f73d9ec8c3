"""The OpenTelemetry SDK behind :mod:`orchestration.observability.tracing` (the ``otel``
extra): a tracer provider of the engine's own, so an embedding app's global one is left alone,
whose ids put every span of a run in the trace named by the run's id."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

#: Attributes are namespaced; a value OTel cannot hold (a dict) is sent as its text.
PREFIX = "orchestration."
_HEX_ID = re.compile(r"[0-9a-f]{32}")
#: The ids the next span gets: set only while the launch span is created.
_forced: ContextVar[tuple[int, int] | None] = ContextVar("orchestration_forced_ids", default=None)


def trace_id_of(run_id: str) -> int:
    """The run's trace id: its own 128 bits when it is a uuid4 hex (every engine run id),
    else a digest of it (an id from elsewhere still maps to one trace)."""
    if _HEX_ID.fullmatch(run_id):
        return int(run_id, 16)
    return int(hashlib.sha256(run_id.encode()).hexdigest()[:32], 16) or 1


def launch_span_id(run_id: str) -> int:
    """The run's launch span id, derived so that any process can name it as a parent."""
    return int(hashlib.sha256(b"launch:" + run_id.encode()).hexdigest()[:16], 16) or 1


def launch_context(run_id: str) -> SpanContext:
    """The run's launch span, as a remote parent."""
    return SpanContext(
        trace_id_of(run_id),
        launch_span_id(run_id),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


class RunIds(RandomIdGenerator):
    """Random ids, except for the launch span, whose ids are the run's."""

    def generate_trace_id(self) -> int:
        forced = _forced.get()
        return forced[0] if forced else super().generate_trace_id()

    def generate_span_id(self) -> int:
        forced = _forced.get()
        return forced[1] if forced else super().generate_span_id()


def _attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        PREFIX + key: value if isinstance(value, str | bool | int | float) else str(value)
        for key, value in values.items()
        if value is not None
    }


class Tracing:
    """A :class:`~orchestration.observability.tracing.Tracer` over the SDK."""

    def __init__(self, processor: SpanProcessor, service: str) -> None:
        self.provider = TracerProvider(
            resource=Resource.create({SERVICE_NAME: service}), id_generator=RunIds()
        )
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("orchestration")
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def exporting(cls, url: str, service: str) -> Tracing:
        """Batched export over OTLP/HTTP to ``url`` (the ``OTEL_BSP_*`` and
        ``OTEL_EXPORTER_OTLP_HEADERS``/``_TIMEOUT`` variables apply as the SDK reads them)."""
        return cls(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)), service)

    def launch(self, run_id: str, started_ns: int, attributes: Mapping[str, Any]) -> None:
        current = trace.get_current_span().get_span_context()
        token = _forced.set((trace_id_of(run_id), launch_span_id(run_id)))
        try:
            span = self.tracer.start_span(
                "run.launch",
                context=Context(),
                links=[Link(current)] if current.is_valid else (),
                attributes=_attributes({"run_id": run_id, **attributes}),
                start_time=started_ns,
            )
        finally:
            _forced.reset(token)
        span.end()

    @contextmanager
    def run_span(
        self,
        run_id: str,
        name: str,
        carrier: Mapping[str, str] | None,
        attributes: Mapping[str, Any],
    ) -> Iterator[None]:
        trace_id = trace_id_of(run_id)
        sent = self.propagator.extract(carrier) if carrier else Context()
        origins = (trace.get_current_span(sent), trace.get_current_span())
        contexts = [span.get_span_context() for span in origins]
        links: list[Link] = []
        parent: Context | None = None
        if contexts[0].is_valid and contexts[0].trace_id == trace_id:
            parent = sent
        elif not (contexts[1].is_valid and contexts[1].trace_id == trace_id):
            # Not sent from within the run's trace: under its launch, linked to the origin.
            parent = trace.set_span_in_context(NonRecordingSpan(launch_context(run_id)))
            links = [Link(found) for found in contexts if found.is_valid]
        with self.tracer.start_as_current_span(
            name,
            context=parent,
            links=links,
            attributes=_attributes({"run_id": run_id, **attributes}),
        ):
            yield

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[None]:
        if not trace.get_current_span().is_recording():
            yield
            return
        with self.tracer.start_as_current_span(name, attributes=_attributes(attributes)):
            yield

    def annotate(self, attributes: Mapping[str, Any], *, error: str | None = None) -> None:
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(_attributes(attributes))
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, error))

    def inject(self, carrier: MutableMapping[str, Any]) -> None:
        if trace.get_current_span().get_span_context().is_valid:
            self.propagator.inject(carrier)

    def shutdown(self) -> None:
        self.provider.shutdown()
