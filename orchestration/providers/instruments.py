"""Provider call instrumentation: latency and errors by provider and call.

Every provider the registry hands out is wrapped in :class:`Instrumented`, so no provider
module has to remember to measure itself. Metrics live in the default Prometheus registry
(per process; set ``PROMETHEUS_MULTIPROC_DIR`` to aggregate prefork children).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from prometheus_client import Counter, Histogram

from orchestration.core.errors import PermanentProviderError, RetryableProviderError
from orchestration.providers.base import JSON, Provider, TurnRef, TurnRequest, TurnStatus

PROVIDER_CALL_SECONDS = Histogram(
    "orchestration_provider_call_seconds",
    "Latency of provider calls.",
    ["provider", "call"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
PROVIDER_ERRORS = Counter(
    "orchestration_provider_errors_total",
    "Provider calls that raised, by kind (retryable outage or permanent refusal).",
    ["provider", "call", "kind"],
)

T = TypeVar("T")


class Instrumented:
    """A provider that records the latency and errors of each call of the one it wraps."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name

    def _measure(self, call: str, action: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return action()
        except RetryableProviderError:
            PROVIDER_ERRORS.labels(self.name, call, "retryable").inc()
            raise
        except PermanentProviderError:
            PROVIDER_ERRORS.labels(self.name, call, "permanent").inc()
            raise
        finally:
            PROVIDER_CALL_SECONDS.labels(self.name, call).observe(time.perf_counter() - started)

    def validate(self, options: Mapping[str, Any]) -> None:
        self.inner.validate(options)

    def start(self, request: TurnRequest) -> str:
        return self._measure("start", lambda: self.inner.start(request))

    def status(self, ref: TurnRef) -> TurnStatus:
        return self._measure("status", lambda: self.inner.status(ref))

    def cancel(self, ref: TurnRef) -> None:
        self._measure("cancel", lambda: self.inner.cancel(ref))

    def snapshot(self, ref: TurnRef) -> JSON:
        return self._measure("snapshot", lambda: self.inner.snapshot(ref))

    def __getattr__(self, name: str) -> Any:
        # Provider-specific helpers (e.g. the scripted provider's ``turns``) pass through.
        return getattr(self.inner, name)
