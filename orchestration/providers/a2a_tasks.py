"""What an A2A task says, in the engine's words: its state mapped, its parts made JSON.

A2A 1.0 (the JSON-RPC binding, as the a2a-sdk serves it): a task's ``status.state`` is a
``TASK_STATE_*`` word, its ``status.message`` the agent's latest message, and its
``artifacts`` hold the answer as parts. A part is a text (``{"text"}``), a JSON value
(``{"data"}``), or a file, given inline (``{"raw"}``: base64) or by address (``{"url"}``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from orchestration.core.errors import PermanentProviderError
from orchestration.providers.base import JSON, ProviderStatus, TurnStatus

#: The task states of A2A 1.0 and what each means to the engine.
WORDS: dict[str, ProviderStatus] = {
    "TASK_STATE_SUBMITTED": ProviderStatus.RUNNING,
    "TASK_STATE_WORKING": ProviderStatus.RUNNING,
    "TASK_STATE_INPUT_REQUIRED": ProviderStatus.INPUT_REQUIRED,
    "TASK_STATE_AUTH_REQUIRED": ProviderStatus.FAILED,
    "TASK_STATE_COMPLETED": ProviderStatus.COMPLETED,
    "TASK_STATE_FAILED": ProviderStatus.FAILED,
    "TASK_STATE_REJECTED": ProviderStatus.FAILED,
    "TASK_STATE_CANCELED": ProviderStatus.CANCELLED,
}
#: States after which the task takes no message and does no work.
TERMINAL = frozenset(
    {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_REJECTED", "TASK_STATE_CANCELED"}
)


def state(task: Mapping[str, Any]) -> str:
    """The task's state word (``""`` when it states none)."""
    status = task.get("status")
    word = status.get("state") if isinstance(status, Mapping) else None
    return word if isinstance(word, str) else ""


def _file(part: Mapping[str, Any]) -> dict[str, JSON]:
    """A file part: its name, media type and either its bytes (base64, with their sha256
    and size, so a reader can check and address them) or its URL (never fetched)."""
    described: dict[str, JSON] = {
        "name": part.get("filename") or None,
        "media_type": part.get("mediaType") or "application/octet-stream",
    }
    if "url" in part:
        return {**described, "url": part["url"]}
    encoded = part.get("raw")
    try:
        data = base64.b64decode(encoded if isinstance(encoded, str) else "", validate=True)
    except (binascii.Error, ValueError):
        raise PermanentProviderError(
            "a2a: a file part's raw bytes are not base64; the agent's answer cannot be read"
        ) from None
    return {
        **described,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "base64": base64.b64encode(data).decode(),
    }


def part_value(part: Any) -> JSON:
    """One part as JSON: a text as a string, data as itself, a file as ``{"file": ...}``."""
    if not isinstance(part, Mapping):
        raise PermanentProviderError(f"a2a: a part is not an object: {str(part)[:100]}")
    if "text" in part:
        return part["text"]
    if "data" in part:
        return part["data"]
    if "raw" in part or "url" in part:
        return {"file": _file(part)}
    known = ", ".join(sorted(part))
    raise PermanentProviderError(f"a2a: a part with none of text, data, raw, url ({known})")


def parts_value(parts: Sequence[Any]) -> JSON:
    """Parts as one JSON value: nothing is ``None``, one part its value, more a list."""
    values = [part_value(part) for part in parts]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _message_parts(task: Mapping[str, Any]) -> list[Any]:
    status = task.get("status")
    message = status.get("message") if isinstance(status, Mapping) else None
    parts = message.get("parts") if isinstance(message, Mapping) else None
    return list(parts) if isinstance(parts, list) else []


def output(task: Mapping[str, Any]) -> JSON:
    """A completed task's answer: its artifacts' parts, in order (the status message's parts
    when it has no artifact)."""
    artifacts = task.get("artifacts")
    parts = [
        part
        for artifact in (artifacts if isinstance(artifacts, list) else [])
        if isinstance(artifact, Mapping)
        for part in (artifact.get("parts") or [])
    ]
    return parts_value(parts or _message_parts(task))


def said(task: Mapping[str, Any]) -> str | None:
    """The text of the agent's status message (its data parts as JSON), if it said any."""
    texts = [
        value if isinstance(value, str) else json.dumps(value)
        for value in (part_value(part) for part in _message_parts(task))
    ]
    return "\n".join(texts) or None


def observed(task: Mapping[str, Any]) -> TurnStatus:
    """The engine's observation of ``task`` (``PermanentProviderError`` for a state A2A 1.0
    does not have)."""
    word = state(task)
    status = WORDS.get(word)
    if status is None:
        raise PermanentProviderError(
            f"a2a: task {task.get('id')} is in state {word[:60]!r}, which A2A 1.0 does not "
            f"have (known: {', '.join(WORDS)})"
        )
    if status is ProviderStatus.COMPLETED:
        return TurnStatus(status, raw=word, output=output(task))
    if status is ProviderStatus.INPUT_REQUIRED:
        return TurnStatus(status, raw=word, prompt=parts_value(_message_parts(task)))
    if status is ProviderStatus.FAILED:
        return TurnStatus(status, raw=word, error=_failure(word, said(task)))
    return TurnStatus(status, raw=word)


def _failure(word: str, text: str | None) -> str:
    """Why a task ended without an answer, in the words of the agent where it gave any."""
    if word == "TASK_STATE_AUTH_REQUIRED":
        return (
            "the agent asks for authentication (auth-required), which a workflow step cannot "
            "give: grant the agent's credentials through a secret header (headers: "
            "{Authorization: {secret: NAME}}) and run again"
            + (f"; the agent said: {text}" if text else "")
        )
    what = "rejected the task" if word == "TASK_STATE_REJECTED" else "failed the task"
    return f"the agent {what}" + (f": {text}" if text else "")
