"""What a step ran on: its agent's evidence (:class:`~orchestration.providers.base.Evidence`)
as a step row keeps it, and the pin's comparison.

A step's ``evidence`` column is ``{launch: ..., start: ...}``: what the agent said of itself
when the run was launched and when the step's latest turn started, each ``{name, version,
detail, at}``, or ``{error, at}`` when it could not be asked (an unpinned step goes on then).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from orchestration import providers
from orchestration.core.errors import PermanentProviderError, RetryableProviderError
from orchestration.core.settings import Settings
from orchestration.limits import bounds

#: Longest name or version kept (an agent states them; the engine bounds them).
_CHARS = 200


def _short(value: Any, settings: Settings) -> str | None:
    return None if value is None else bounds.error_text(str(value), settings)[:_CHARS]


def observe(
    settings: Settings, provider_name: str, options: Mapping[str, Any], now: datetime
) -> dict[str, Any] | None:
    """Ask the step's agent what it is (one bounded call, through the egress rules); ``None``
    when its provider does not describe itself. A failed call is kept as ``{error}``, with
    ``retryable`` saying whether it was an outage."""
    provider = providers.get_provider(provider_name, settings)
    describe = getattr(provider, "describe", None)
    if describe is None:
        return None
    at = now.isoformat()
    try:
        found = describe(options)
    except (RetryableProviderError, PermanentProviderError) as exc:
        retryable = isinstance(exc, RetryableProviderError)
        return {"error": bounds.error_text(str(exc), settings), "retryable": retryable, "at": at}
    if found is None:  # this step's agent says nothing of itself (a scripted one may)
        return None
    detail = {str(key): _short(value, settings) for key, value in dict(found.detail).items()}
    return {
        "name": _short(found.name, settings),
        "version": _short(found.version, settings),
        "detail": detail,
        "at": at,
    }


def changed(launch: Mapping[str, Any] | None, start: Mapping[str, Any] | None) -> str | None:
    """Why a pinned step may not start: its agent's version at the start is not the one
    recorded at launch (both named); ``None`` when it is, or there is nothing to compare."""
    if not launch or not start or "error" in launch or "error" in start:
        return None
    before, now = launch.get("version"), start.get("version")
    if before == now:
        return None
    name = start.get("name") or launch.get("name") or "the agent"
    return (
        f"agent {name!r} changed under a pinned step: version {before!r} at launch, "
        f"{now!r} at the step's start (pin: true)"
    )
