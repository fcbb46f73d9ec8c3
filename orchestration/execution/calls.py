"""The provider calls of one execution, their answers made fit to store."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestration import providers
from orchestration.core.errors import PermanentProviderError, RetryableProviderError
from orchestration.core.settings import Settings
from orchestration.limits import bounds
from orchestration.observability import tracing
from orchestration.providers.base import FINISHED, ProviderStatus, TurnRef, TurnStatus
from orchestration.runs import effects


def status(
    settings: Settings, provider_name: str, ref: TurnRef, *, raise_outage: bool = False
) -> TurnStatus:
    """One status call, its strings redacted and bounded, fit to store. A vanished turn is a
    failed one; an outage raises (``raise_outage``) or reads as still pending."""
    provider = providers.get_provider(provider_name, settings)
    try:
        with tracing.span("provider.status", provider=provider_name, key=ref.key):
            observed = provider.status(ref)
    except RetryableProviderError:
        if raise_outage:
            raise
        observed = TurnStatus(ProviderStatus.PENDING, raw="started")
    except PermanentProviderError as exc:
        observed = TurnStatus(ProviderStatus.FAILED, raw="lost", error=str(exc))
    return replace(
        observed,
        raw=bounds.error_text(observed.raw, settings)[:200],
        output=bounds.json_value(observed.output, settings),
        prompt=bounds.json_value(observed.prompt, settings),
        error=None if observed.error is None else bounds.error_text(observed.error, settings),
    )


def capture(
    settings: Settings, provider_name: str, ref: TurnRef, observed: TurnStatus
) -> tuple[Any, str | None] | None:
    """The inline checkpoint of a finished turn (``None``: not finished, or the effects go
    through the outbox)."""
    if observed.status not in FINISHED or not effects.inline(settings):
        return None
    return effects.capture(settings, provider_name, ref)
