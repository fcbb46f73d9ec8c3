"""OpenTelemetry traces, one per run; nothing at all unless configured.

A run's trace id is its id (``uuid4().hex``: 128 bits) and its launch span's id is derived
from it, so a process that never saw a message of the run (the sweeper, a cancel from another
web process) still puts its spans in the run's trace, under the launch. W3C ``traceparent``
headers on Celery messages (``runtime.celery_observing``) make a step execution the child of
the execution, or launch, that sent it. The OpenTelemetry packages are the ``otel`` extra:
without them, or with no endpoint configured, every function here does nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

from orchestration.core.errors import ConfigurationError
from orchestration.core.settings import Settings
from orchestration.core.url_checks import check_web_url

LOG = logging.getLogger(__name__)
#: The path an OTLP/HTTP collector takes traces on, after a base endpoint.
TRACES_PATH = "/v1/traces"
#: Where ``OTEL_TRACES_EXPORTER=otlp`` sends with no endpoint set (the OTLP default).
DEFAULT_ENDPOINT = "http://localhost:4318" + TRACES_PATH


class Tracer(Protocol):
    """What :mod:`orchestration.observability.otel` implements over the SDK."""

    def launch(self, run_id: str, started_ns: int, attributes: Mapping[str, Any]) -> None:
        """Record the run's root span, from ``started_ns`` to now."""

    def run_span(
        self,
        run_id: str,
        name: str,
        carrier: Mapping[str, str] | None,
        attributes: Mapping[str, Any],
    ) -> AbstractContextManager[None]:
        """A current span in the run's trace."""

    def span(self, name: str, attributes: Mapping[str, Any]) -> AbstractContextManager[None]:
        """A current child of the current span."""

    def annotate(self, attributes: Mapping[str, Any], *, error: str | None = None) -> None:
        """Set attributes (and an error status) on the current span."""

    def inject(self, carrier: MutableMapping[str, Any]) -> None:
        """Write the current span's ``traceparent`` into ``carrier``."""

    def shutdown(self) -> None:
        """Export what is buffered and stop."""


_active: Tracer | None = None


def endpoint(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP traces URL to export to, or ``None`` (off). ``ORCH_OTEL_ENDPOINT`` first,
    then OpenTelemetry's own variables, which are honoured as the SDK documents them
    (``OTEL_SDK_DISABLED``, ``OTEL_TRACES_EXPORTER``, ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``).
    Raises :class:`ConfigurationError` naming the variable whose URL is not http(s)."""
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if exporters and "otlp" not in {name.strip() for name in exporters.split(",")}:
        return None
    traces, base = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"
    candidates = (
        ("ORCH_OTEL_ENDPOINT", settings.otel_endpoint, True),
        (traces, environ.get(traces), False),
        (base, environ.get(base), True),
    )
    for variable, value, is_base in candidates:
        if value:
            try:
                check_web_url(value)
            except ValueError as exc:
                raise ConfigurationError(f"{variable}: {exc}") from None
            return value.rstrip("/") + TRACES_PATH if is_base else value
    return DEFAULT_ENDPOINT if exporters else None


def setup(settings: Settings, service: str) -> bool:
    """Start exporting this process's spans when configured; returns whether tracing is on.
    Idempotent. Without the ``otel`` extra, a configured endpoint is one warning, not a
    failure: traces are an aid, and the run must not depend on them."""
    url = endpoint(settings, os.environ)
    if url is None or _active is not None:
        return _active is not None
    try:
        from orchestration.observability import otel
    except ImportError:
        LOG.warning(
            "traces are configured (%s) but OpenTelemetry is not installed: "
            "pip install 'orchestration[otel]'",
            url,
        )
        return False
    install(otel.Tracing.exporting(url, os.environ.get("OTEL_SERVICE_NAME") or service))
    return True


def install(tracer: Tracer | None) -> None:
    """Make ``tracer`` this process's (``None``: off); the one shut down is flushed first."""
    global _active
    previous, _active = _active, tracer
    if previous is not None and previous is not tracer:
        previous.shutdown()


def shutdown() -> None:
    """Flush and stop (a worker's pool process on its way out)."""
    install(None)


def launch(run_id: str, started_ns: int, **attributes: Any) -> None:
    """The root span of a new run, from ``started_ns`` (``time.time_ns()``) to now."""
    if _active is not None:
        _active.launch(run_id, started_ns, attributes)


def run_span(
    run_id: str, name: str, *, carrier: Mapping[str, str] | None = None, **attributes: Any
) -> AbstractContextManager[None]:
    """A span in the run's trace for the block: the child of the span in ``carrier`` (a
    message's headers) or of the current span when either is in this run's trace, else of
    the launch (linked to the current span of another trace, e.g. a sweeper pass)."""
    if _active is None:
        return nullcontext()
    return _active.run_span(run_id, name, carrier, attributes)


def span(name: str, **attributes: Any) -> AbstractContextManager[None]:
    """A child span of the current one for the block (a provider call); nothing outside a
    run's span, so that a call never starts a trace of its own."""
    if _active is None:
        return nullcontext()
    return _active.span(name, attributes)


def annotate(attributes: Mapping[str, Any], *, error: str | None = None) -> None:
    """Add attributes to the current span; with ``error``, mark it failed."""
    if _active is not None:
        _active.annotate(attributes, error=error)


def inject(carrier: MutableMapping[str, Any]) -> None:
    """Put the current span's W3C trace context into a message's headers."""
    if _active is not None:
        _active.inject(carrier)


@contextmanager
def installed(tracer: Tracer) -> Iterator[Tracer]:
    """``tracer`` for the block, then off again (tests, and a CLI command that exits)."""
    install(tracer)
    try:
        yield tracer
    finally:
        install(None)
