"""Signing in to the dashboard and out of it.

The token is sent once through the sign-in form (a POST, so it never lands in a URL, a
history entry or an access log) and kept in an ``HttpOnly``, ``SameSite=Strict`` cookie
scoped to ``/dashboard``. The form has no session yet, so its CSRF value is a random one that
must match a cookie set with the form (double submit); the sign-out form carries the
session's own CSRF value, like every other form. The cookies are ``Secure`` unless
``ORCH_DASHBOARD_PLAIN_HTTP`` says the dashboard is reached over plain http on loopback: the
app cannot tell a proxy that ends TLS from plain http, so it does not guess.
"""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from orchestration.surfaces.api.auth import COOKIE, csrf_ok, resolve, same_secret
from orchestration.surfaces.api.auth import orchestrator as app_orchestrator
from orchestration.surfaces.api.dashboard import form_of, render, signed_in_as, to_login

router = APIRouter(prefix="/dashboard", include_in_schema=False)

#: How long the session cookie lasts (seconds); revoking the token ends it at once anyway.
COOKIE_MAX_AGE = 12 * 3600
#: The sign-in form's double-submit CSRF cookie, and how long a form stays valid (seconds).
LOGIN_CSRF_COOKIE = "orch_login_csrf"
LOGIN_CSRF_MAX_AGE = 3600


def secure_cookies(request: Request) -> bool:
    """Whether the dashboard's cookies get the ``Secure`` flag: always over https, and over
    http too unless the deployment is plain http on loopback (``ORCH_DASHBOARD_PLAIN_HTTP``)."""
    plain = app_orchestrator(request).settings.dashboard_plain_http
    return request.url.scheme == "https" or not plain


def _login_form(request: Request, status_code: int = 200, error: str | None = None) -> HTMLResponse:
    """The sign-in form, with its CSRF value in the form and in a cookie (double submit).

    The value a browser already holds is kept, so a second tab's form stays valid.
    """
    value = request.cookies.get(LOGIN_CSRF_COOKIE) or secrets.token_urlsafe(32)
    response = render("login.html", status_code, owner=None, error=error, login_csrf=value)
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        value,
        max_age=LOGIN_CSRF_MAX_AGE,
        path="/dashboard/login",
        httponly=True,
        samesite="strict",
        secure=secure_cookies(request),
    )
    return response


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request) -> Response:
    """The sign-in form."""
    return _login_form(request)


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the form's CSRF value and the token, then keep the token in the cookie.

    Without the CSRF check a page on another site could post its own token and sign the
    browser in as the attacker's owner (login CSRF); a ``SameSite=Strict`` cookie is not
    sent with that cross-site post, and the other site cannot read it to fill the form.
    """
    form = await form_of(request)
    expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not expected or not same_secret(expected, form.get("csrf", "")):
        return _login_form(
            request,
            403,
            "the sign-in form is stale or came from another site; sign in again from this page",
        )
    token = form.get("token", "").strip()
    orch = app_orchestrator(request)
    if await run_in_threadpool(resolve, orch, token) is None:
        return _login_form(request, 401, "unknown or revoked token")
    secure = secure_cookies(request)
    response = RedirectResponse("/dashboard", status_code=303)
    response.delete_cookie(
        LOGIN_CSRF_COOKIE, path="/dashboard/login", secure=secure, httponly=True, samesite="strict"
    )
    response.set_cookie(
        COOKIE,
        token,
        max_age=COOKIE_MAX_AGE,
        path="/dashboard",
        httponly=True,
        samesite="strict",
        secure=secure,
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Forget the cookie, when the form carries the session's CSRF value: a page on another
    site cannot sign the browser out. Without a live session there is nothing to protect,
    and the cookie is cleared."""
    signed = await run_in_threadpool(signed_in_as, request)
    if signed is not None:
        form = await form_of(request)
        if not csrf_ok(signed.token, form.get("csrf", "")):
            return render(
                "error.html",
                403,
                **signed.page(),
                title="Refused",
                message="the sign-out form is stale or came from another site; "
                "sign out from a dashboard page",
            )
    response = to_login()
    response.delete_cookie(
        COOKIE, path="/dashboard", secure=secure_cookies(request), httponly=True, samesite="strict"
    )
    return response
