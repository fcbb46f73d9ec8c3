"""Every HTTP error as ``{"error": {"code", "message", "field"}}`` with a stable code.

The codes are the ``.code`` of :mod:`orchestration.core.errors`, plus a few that only HTTP has
(``unauthorized``, ``body_too_large``, ``method_not_allowed``, ``internal_error``). Clients
branch on the code, never on the message.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchestration.core.errors import (
    ArtifactCorrupt,
    ArtifactNotFound,
    BrokerUnavailable,
    ConfigurationError,
    ConflictError,
    DatabaseNotReady,
    IdempotencyConflict,
    IllegalTransition,
    LimitExceeded,
    OrchestrationError,
    OwnerSuspended,
    ProviderError,
    RunNotFound,
    ValidationError,
)

LOG = logging.getLogger(__name__)

#: HTTP status per error class; the first ``isinstance`` match wins, so subclasses come first.
#: ``limit_exceeded`` is 422, not 400: the input is well-formed but over a configured limit
#: (args size, active runs), which a client handles differently from a malformed request.
STATUS: tuple[tuple[type[OrchestrationError], int], ...] = (
    (LimitExceeded, 422),
    (ValidationError, 400),
    (OwnerSuspended, 403),
    (RunNotFound, 404),
    (ArtifactNotFound, 404),
    (ArtifactCorrupt, 500),
    (IdempotencyConflict, 409),
    (ConflictError, 409),
    (IllegalTransition, 409),
    (DatabaseNotReady, 503),
    (BrokerUnavailable, 503),
    (ConfigurationError, 500),
    (ProviderError, 502),
)

#: Codes for plain HTTP errors raised by routing (unknown path, wrong method, …).
_HTTP_CODES = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
}


class ApiError(Exception):
    """An HTTP-only error (auth, body size) in the same shape as the domain errors."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """The one error shape."""
    return {"error": {"code": code, "message": message, "field": field}}


def status_for(exc: OrchestrationError) -> int:
    """The HTTP status of a domain error (500 for one this table does not know)."""
    return next((status for cls, status in STATUS if isinstance(exc, cls)), 500)


def _field(loc: Sequence[int | str]) -> str:
    # ("body", "steps", 0, "id") -> "steps[0].id", the same dotted path the domain uses.
    parts = list(loc[1:]) if loc and loc[0] in ("body", "query", "path", "header") else list(loc)
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "body"


#: A key ``true`` or ``false`` that the schema refuses: what a YAML 1.1 parser makes of an
#: unquoted ``on:``, ``off:``, ``yes:`` or ``no:`` key, once dumped as JSON.
_YAML11_KEY = re.compile(r"(?:^|\.)(?:true|false)$")


def message_of(exc: OrchestrationError) -> str:
    """The error's message; for an unknown ``true`` key (``retry.on`` sent through YAML 1.1),
    also what happened and how to write it."""
    message = str(exc)
    if isinstance(exc, ValidationError) and _YAML11_KEY.search(exc.field):
        message += (
            ": a YAML 1.1 parser (PyYAML's yaml.safe_load) reads an unquoted on: key as true; "
            'quote it ("on": [failed]) or read the file with orchestration.workflows.load_file'
        )
    return message


async def _domain(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OrchestrationError)
    field = exc.field if isinstance(exc, ValidationError) else None
    body = error_body(exc.code, message_of(exc), field)
    if isinstance(exc, BrokerUnavailable):
        # The run is saved: the client keeps its id (the same Idempotency-Key returns it).
        body["error"]["run_id"] = exc.run_id
    return JSONResponse(body, status_code=status_for(exc))


async def _api(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(
        error_body(exc.code, exc.message), status_code=exc.status, headers=exc.headers
    )


async def _invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first: dict[str, Any] = dict(errors[0]) if errors else {}
    field = _field(first.get("loc", ("body",)))
    message = f"{field}: {first.get('msg', 'invalid request')}"
    if first.get("type") == "json_invalid":
        field = "body"
        detail = (first.get("ctx") or {}).get("error", "decode error")
        message = f"body: not valid JSON ({detail})"
    elif field == "body":
        message += " (send a JSON object with Content-Type: application/json)"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return JSONResponse(error_body("validation_error", message, field), status_code=400)


async def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    return JSONResponse(
        error_body(code, str(exc.detail)), status_code=exc.status_code, headers=exc.headers
    )


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    # The details go to the log, never to the caller: they may hold another owner's data.
    LOG.exception("unhandled error in the HTTP API", exc_info=exc)
    return JSONResponse(error_body("internal_error", "internal error; see the server log"), 500)


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(OrchestrationError, _domain)
    app.add_exception_handler(ApiError, _api)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)
