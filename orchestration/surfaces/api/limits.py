"""The request body limit, enforced before any route reads the body.

``Content-Length`` over the limit is refused at once; a chunked body is counted as it arrives
and refused as soon as it passes the limit, so no request can make the server buffer more
than the limit. Configured by ``ORCH_API_MAX_BODY_BYTES`` (default 256 KiB), read when the
app is built.
"""

from __future__ import annotations

import json
import os

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestration.core.errors import ConfigurationError
from orchestration.surfaces.api.errors import error_body

#: Default limit on a request body (bytes). Launch args are also bounded by
#: ``ORCH_MAX_ARGS_BYTES``; this bound covers the whole body, workflow included.
DEFAULT_MAX_BODY_BYTES = 256 * 1024


def max_body_bytes() -> int:
    """``ORCH_API_MAX_BODY_BYTES``, checked."""
    raw = os.environ.get("ORCH_API_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY_BYTES))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigurationError(f"ORCH_API_MAX_BODY_BYTES must be a positive integer, not {raw!r}")
    return value


class BodyLimit:
    """ASGI middleware: 413 ``body_too_large`` for a body over ``limit`` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                # After the body, the app only waits for a disconnect.
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        payload = json.dumps(
            error_body(
                "body_too_large",
                f"the request body is over {self.limit} bytes (ORCH_API_MAX_BODY_BYTES)",
            )
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
