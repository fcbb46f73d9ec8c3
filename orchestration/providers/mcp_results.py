"""What an MCP task and a tool's result say, in the engine's words.

MCP 2025-11-25: a task's ``status`` is one of ``working``, ``input_required``, ``completed``,
``failed`` and ``cancelled``, with an optional ``statusMessage``. A completed task's result
(``tasks/result``) is what ``tools/call`` would have answered: a ``CallToolResult`` whose
``content`` is a list of blocks (``text``, ``image``, ``audio``, ``resource_link``,
``resource``), with ``structuredContent`` when the tool declares an output, and ``isError``
when the tool itself failed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from typing import Any

from orchestration.core.errors import PermanentProviderError
from orchestration.providers.base import JSON, ProviderStatus, TurnStatus

#: The task statuses of MCP 2025-11-25 and what each means to the engine (``completed`` is
#: read further: its result may be the tool's error).
WORDS: dict[str, ProviderStatus] = {
    "working": ProviderStatus.RUNNING,
    "input_required": ProviderStatus.INPUT_REQUIRED,
    "completed": ProviderStatus.COMPLETED,
    "failed": ProviderStatus.FAILED,
    "cancelled": ProviderStatus.CANCELLED,
}


def _bytes(block: Mapping[str, Any], field: str) -> dict[str, JSON]:
    """Inline bytes (base64) with their sha256 and size, so a reader can check them."""
    encoded = block.get(field)
    try:
        data = base64.b64decode(encoded if isinstance(encoded, str) else "", validate=True)
    except (binascii.Error, ValueError):
        raise PermanentProviderError(
            f"mcp: a {block.get('type')} block's bytes are not base64; the answer cannot be read"
        ) from None
    return {
        "media_type": block.get("mimeType") or "application/octet-stream",
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "base64": base64.b64encode(data).decode(),
    }


def block_value(block: Any) -> JSON:
    """One content block as JSON: a text as a string, anything else as ``{type: ...}``."""
    if not isinstance(block, Mapping):
        raise PermanentProviderError(f"mcp: a content block is not an object: {str(block)[:100]}")
    kind = block.get("type")
    if kind == "text":
        return block.get("text")
    if kind in ("image", "audio"):
        return {kind: _bytes(block, "data")}
    if kind == "resource_link":
        return {"resource_link": {"uri": block.get("uri"), "name": block.get("name")}}
    if kind == "resource":
        resource = block.get("resource")
        if not isinstance(resource, Mapping):
            raise PermanentProviderError("mcp: an embedded resource block holds no resource")
        if "text" in resource:
            return {"resource": {"uri": resource.get("uri"), "text": resource.get("text")}}
        return {"resource": {"uri": resource.get("uri"), **_bytes(resource, "blob")}}
    raise PermanentProviderError(f"mcp: a content block of unknown type {str(kind)[:60]!r}")


def output(result: Mapping[str, Any]) -> JSON:
    """A tool's answer: its structured content when it has some (what the tool declares
    for programs), else its content blocks (nothing is ``None``, one its value, more a list)."""
    structured = result.get("structuredContent")
    if structured is not None:
        return structured
    content = result.get("content")
    values = [block_value(block) for block in content] if isinstance(content, list) else []
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def said(result: Mapping[str, Any]) -> str:
    """The text blocks of a result, joined (what a failed tool says)."""
    content = result.get("content")
    texts = [
        str(block.get("text"))
        for block in (content if isinstance(content, list) else [])
        if isinstance(block, Mapping) and block.get("type") == "text"
    ]
    return "\n".join(texts)


def finished(result: Any, raw: str) -> TurnStatus:
    """A tool's result as the end of a turn: ``isError`` fails it with the tool's text."""
    if not isinstance(result, Mapping):
        raise PermanentProviderError(
            f"mcp: the tool's result is not an object: {str(result)[:100]}"
        )
    if result.get("isError") is True:
        text = said(result)
        error = f"the tool failed: {text}" if text else "the tool failed (it said nothing)"
        return TurnStatus(ProviderStatus.FAILED, raw=raw, error=error)
    return TurnStatus(ProviderStatus.COMPLETED, raw=raw, output=output(result))


def status_word(task: Any) -> str:
    """A task's status word, checked against the ones MCP 2025-11-25 has."""
    word = task.get("status") if isinstance(task, Mapping) else None
    if not isinstance(word, str) or word not in WORDS:
        raise PermanentProviderError(
            f"mcp: the task is in status {str(word)[:60]!r}, which MCP 2025-11-25 does not have "
            f"(known: {', '.join(WORDS)})"
        )
    return word


def observed(task: Mapping[str, Any]) -> TurnStatus:
    """The engine's observation of a task that is not ``completed`` (whose result the caller
    reads with ``tasks/result``)."""
    word = status_word(task)
    message = task.get("statusMessage")
    text = message if isinstance(message, str) and message else None
    status = WORDS[word]
    if status is ProviderStatus.INPUT_REQUIRED:
        return TurnStatus(status, raw=word, prompt=text)
    if status is ProviderStatus.FAILED:
        return TurnStatus(
            status, raw=word, error="the tool's task failed" + (f": {text}" if text else "")
        )
    return TurnStatus(status, raw=word)
