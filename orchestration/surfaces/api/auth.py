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

from orchestration.db import session_scope
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


def resolve(orch: Orchestrator, token: str | None) -> str | None:
    """The owner for ``token``, or ``None`` when it is missing, unknown or revoked."""
    if not token:
        return None
    with session_scope(orch.settings.database_url) as session:
        return tokens.owner_for(session, token)


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def api_owner(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> str:
    """The owner of a JSON API request; 401 ``unauthorized`` otherwise."""
    if credentials is None:
        raise _unauthorized("missing bearer token: send `Authorization: Bearer <token>`")
    owner = resolve(orchestrator(request), credentials.credentials)
    if owner is None:
        raise _unauthorized("unknown or revoked token")
    return owner


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
Orch = Annotated[Orchestrator, Depends(orchestrator)]
