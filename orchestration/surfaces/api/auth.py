"""Who is calling: a bearer token (the API) or the same token in a cookie (the dashboard).

The JSON API accepts only the ``Authorization`` header, so a browser holding the dashboard
cookie cannot be tricked into calling it cross-site; the dashboard's own forms carry a CSRF
value derived from the token (:func:`csrf_value`) and the cookie is ``SameSite=Strict``. The
sign-in form, which has no token yet, uses a double-submit cookie instead (see
:mod:`orchestration.surfaces.api.dashboard`).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from orchestration.core.db import session_scope
from orchestration.limits import suspensions
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.errors import ApiError

#: The dashboard's cookie; it holds the same bearer token.
COOKIE = "orch_token"

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearerAuth",
    description="An API token from `orchestration tokens create --owner OWNER`.",
)


def orchestrator(request: Request) -> Orchestrator:
    """The app's :class:`Orchestrator` (set by ``create_app``)."""
    orch: Orchestrator = request.app.state.orchestrator
    return orch


def resolve(orch: Orchestrator, token: str | None) -> tuple[str, str | None] | None:
    """``(owner, operator name)`` for ``token`` (the name only for an operator's token, whose
    owner is ``""``), or ``None`` when it is missing, unknown or revoked."""
    if not token:
        return None
    with session_scope(orch.settings.database_url) as session:
        row = tokens.holder_of(session, token)
        if row is None:
            return None
        return row.owner, (row.name or "operator") if row.operator else None


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def _holder(
    request: Request, credentials: HTTPAuthorizationCredentials | None
) -> tuple[str, str | None, bool]:
    """``(owner, name, operator)`` of the request's live token; 401 ``unauthorized`` else,
    and 403 ``owner_suspended`` for a token of a suspended owner (an operator's token acts
    as no owner, and keeps working)."""
    if credentials is None:
        raise _unauthorized("missing bearer token: send `Authorization: Bearer <token>`")
    with session_scope(orchestrator(request).settings.database_url) as session:
        row = tokens.holder_of(session, credentials.credentials)
        if row is None:
            raise _unauthorized("unknown or revoked token")
        held = None if row.operator else suspensions.of(session, row.owner)
        if held is not None:
            raise ApiError(403, "owner_suspended", str(held.error()))
        return row.owner, row.name, row.operator


def api_owner(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> str:
    """The owner of a JSON API request; 401 ``unauthorized`` otherwise, 403 ``forbidden``
    for an operator's token (it acts as no owner: its routes are under ``/operator``)."""
    owner, _, operator = _holder(request, credentials)
    if operator:
        raise ApiError(
            403, "forbidden", "an operator token acts as no owner; use the /operator routes"
        )
    return owner


def api_operator(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> str:
    """The name of the operator token of a request (what the journal shows); 403
    ``forbidden`` for an owner's token."""
    _, name, operator = _holder(request, credentials)
    if not operator:
        raise ApiError(
            403, "forbidden", "this route needs an operator token (tokens create --operator)"
        )
    return name or "operator"


def dashboard_token(request: Request) -> str | None:
    """The token of a dashboard request: the cookie, or a bearer header."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value:
        return value.strip()
    return request.cookies.get(COOKIE)


def csrf_value(token: str) -> str:
    """The CSRF value for forms of the session holding ``token``: only a page that can read
    the dashboard (same origin) can know it."""
    return hmac.new(
        tokens.hash_token(token).encode(), b"dashboard-csrf", hashlib.sha256
    ).hexdigest()


def same_secret(expected: str, given: str) -> bool:
    """A constant-time comparison of two texts, compared as UTF-8 bytes: on ``str``,
    ``hmac.compare_digest`` raises for non-ASCII input, which made a forged form a 500."""
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace"))


def csrf_ok(token: str, value: str) -> bool:
    """Whether a submitted CSRF value matches the session's token."""
    return same_secret(csrf_value(token), value)


ApiOwner = Annotated[str, Depends(api_owner)]
ApiOperator = Annotated[str, Depends(api_operator)]
Orch = Annotated[Orchestrator, Depends(orchestrator)]
