"""Bounds on what a tenant controls or a provider returns, applied before anything is stored.

A provider service may be hostile: it can answer a 300-character run id, a 16 MB error, an
echo of the secret it was sent, or text with NUL characters that PostgreSQL refuses. Every
such value passes through here first: secrets are redacted, NULs dropped, error text cut to
``ORCH_MAX_ERROR_CHARS``; a value that cannot be cut (an id, an output, a prompt) is refused
with a message naming its setting, and the step fails ``over_limit`` instead of the database
raising.
"""

from __future__ import annotations

import json
from typing import Any

from orchestration.core.settings import Settings
from orchestration.limits import secrets

#: The deepest a task or a provider's options may nest: deeper values are almost always a
#: mistake or an attack.
MAX_DEPTH = 32


def _clean(text: str) -> str:
    return text.replace("\x00", "")


def _clean_json(value: Any) -> Any:
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, list):
        return [_clean_json(item) for item in value]
    if isinstance(value, dict):
        return {_clean(str(key)): _clean_json(item) for key, item in value.items()}
    return value


def error_text(text: str, settings: Settings) -> str:
    """``text`` redacted and cut to ``ORCH_MAX_ERROR_CHARS``, saying how much was cut."""
    clean = _clean(secrets.redact(text, settings))
    limit = settings.max_error_chars
    if len(clean) <= limit:
        return clean
    note = f" … ({len(clean) - limit} more characters cut; ORCH_MAX_ERROR_CHARS)"
    return clean[: max(0, limit - len(note))] + note


def json_value(value: Any, settings: Settings) -> Any:
    """A provider-returned JSON value, redacted and without NULs."""
    return _clean_json(secrets.redact_json(value, settings))


def json_bytes(value: Any) -> int:
    """Bytes of ``value`` as the engine stores it."""
    return len(json.dumps(value, ensure_ascii=False).encode())


def over(value: Any, limit: int, what: str, setting: str) -> str | None:
    """Why ``value`` does not fit ``limit`` bytes, or ``None`` when it does."""
    size = json_bytes(value)
    if size <= limit:
        return None
    return f"{what} is {size} bytes, over the limit of {limit} ({setting})"


def provider_id(value: str, settings: Settings) -> str | None:
    """Why a provider's run id cannot be kept, or ``None`` when it can."""
    limit = settings.max_provider_id_chars
    if len(value) > limit:
        return (
            f"the provider answered a run id of {len(value)} characters, over the limit of "
            f"{limit} (ORCH_MAX_PROVIDER_ID_CHARS)"
        )
    if "\x00" in value or not value.isprintable():
        return "the provider answered a run id with control characters"
    return None
