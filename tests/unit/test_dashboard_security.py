"""The dashboard's own defences (issue 30): security headers on every response, a policy that
allows no inline script or style, a ``Secure`` session cookie unless the deployment says it
is plain http on loopback, and a sign-out form that checks the session's CSRF value."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from orchestration.core.db import session_scope, utcnow
from orchestration.core.settings import Settings
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.surfaces.api.auth import COOKIE, csrf_value
from orchestration.surfaces.api.signin import LOGIN_CSRF_COOKIE
from tests.unit.support import RecordingDispatcher, step_spec

OWNER = "owner-1"


def _app(
    settings: Settings, base_url: str = "http://testserver"
) -> tuple[TestClient, str, Orchestrator]:
    orch = Orchestrator(settings, RecordingDispatcher())
    with session_scope(settings.database_url) as session:
        token = tokens.create(session, OWNER, "t", now=utcnow())
    client = TestClient(create_app(orch), base_url=base_url, follow_redirects=False)
    return client, token, orch


def _directives(policy: str) -> dict[str, str]:
    return {
        name: value.strip()
        for name, _, value in (part.strip().partition(" ") for part in policy.split(";"))
    }


def test_every_response_carries_a_strict_policy_and_no_framing_or_sniffing(
    settings: Settings,
) -> None:
    client, token, orch = _app(settings)
    flow = {"name": "csp", "steps": [step_spec("a")]}
    orch.register_workflow(flow, owner=OWNER)
    run = orch.launch("csp", owner=OWNER)
    signed = {"Authorization": f"Bearer {token}"}
    pages = {
        "/dashboard/login": {},
        "/dashboard": signed,
        f"/dashboard/runs/{run.id}": signed,
        "/dashboard/runs/nope": signed,
        "/dashboard/launch": signed,
        "/dashboard/schedules": signed,
    }
    others = {
        "/dashboard/static/dashboard.css": {},
        "/dashboard/static/live.js": {},
        "/runs": signed,
        "/runs/nope": signed,
        "/openapi.json": {},
    }
    for path, headers in {**pages, **others}.items():
        reply = client.get(path, headers=headers)
        assert reply.status_code in (200, 404), (path, reply.status_code)
        assert reply.headers["x-frame-options"] == "DENY", path
        assert reply.headers["x-content-type-options"] == "nosniff", path
        policy = _directives(reply.headers["content-security-policy"])
        assert policy["default-src"] == "'none'", path
        assert policy["frame-ancestors"] == "'none'", path
        for directive in ("script-src", "style-src", "connect-src", "form-action"):
            assert policy[directive] == "'self'", (path, directive)
        assert "unsafe" not in reply.headers["content-security-policy"], path
        if path in pages:
            # The policy allows no inline code, so the pages hold none: their script and
            # stylesheet come from /dashboard/static.
            html = reply.text
            assert not re.search(r"<script(?![^>]*\bsrc=)", html), path
            assert "<style" not in html and " style=" not in html, path
            assert not re.search(r"\son[a-z]+=", html), path
    assert (
        client.get("/dashboard/static/live.js")
        .headers["content-type"]
        .startswith("text/javascript")
    )
    assert (
        client.get("/dashboard/static/dashboard.css").headers["content-type"].startswith("text/css")
    )
    # Refused early (body over the limit) and unauthenticated answers carry them too.
    assert client.get("/dashboard/fleet").headers["x-frame-options"] == "DENY"
    big = client.post("/runs", content=b"x" * (300 * 1024), headers=signed)
    assert big.status_code == 413 and big.headers["x-content-type-options"] == "nosniff"


def _cookie_flags(set_cookie: list[str], name: str) -> set[str]:
    line = next(one for one in set_cookie if one.startswith(f"{name}="))
    return {part.strip().split("=")[0].lower() for part in line.split(";")[1:]}


def _sign_in(client: TestClient, token: str) -> tuple[list[str], list[str]]:
    """The sign-in form's and the sign-in's ``Set-Cookie`` lines. The form's CSRF cookie is
    sent back by hand: a client that honours ``Secure`` keeps it from plain http."""
    form = client.get("/dashboard/login")
    value = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert value is not None
    done = client.post(
        "/dashboard/login",
        data={"token": token, "csrf": value.group(1)},
        headers={"Cookie": f"{LOGIN_CSRF_COOKIE}={value.group(1)}"},
    )
    assert done.status_code == 303, done.text
    return form.headers.get_list("set-cookie"), done.headers.get_list("set-cookie")


@pytest.mark.parametrize(
    ("plain_http", "base_url", "secure"),
    [
        (False, "http://testserver", True),  # behind a proxy that ends TLS, the app sees http
        (False, "https://testserver", True),
        (True, "http://127.0.0.1:8000", False),  # the setting: plain http on loopback
        (True, "https://testserver", True),  # https is always Secure
    ],
)
def test_the_cookies_are_secure_unless_the_deployment_is_plain_http_on_loopback(
    settings_factory: Callable[..., Settings], plain_http: bool, base_url: str, secure: bool
) -> None:
    client, token, _ = _app(settings_factory(dashboard_plain_http=plain_http), base_url)
    form, signed_in = _sign_in(client, token)
    for lines, name in ((form, LOGIN_CSRF_COOKIE), (signed_in, COOKIE)):
        flags = _cookie_flags(lines, name)
        assert {"httponly", "samesite"} <= flags, (name, flags)
        assert ("secure" in flags) is secure, (name, flags)


def test_sign_out_needs_the_sessions_csrf_value(settings: Settings) -> None:
    client, token, _ = _app(settings)
    session = {"Cookie": f"{COOKIE}={token}"}
    page = client.get("/dashboard", headers=session).text
    assert re.search(
        r'<form method="post" action="/dashboard/logout">\s*'
        rf'<input type="hidden" name="csrf" value="{csrf_value(token)}">',
        page,
    ), page
    for forged in ({}, {"csrf": "guess"}, {"csrf": "é" * 64}):
        refused = client.post("/dashboard/logout", data=forged, headers=session)
        assert refused.status_code == 403, (forged, refused.status_code)
        assert "set-cookie" not in refused.headers  # still signed in
    done = client.post("/dashboard/logout", data={"csrf": csrf_value(token)}, headers=session)
    assert (done.status_code, done.headers["location"]) == (303, "/dashboard/login")
    gone = _cookie_flags(done.headers.get_list("set-cookie"), COOKIE)
    assert "max-age" in gone and f'{COOKIE}=""' in done.headers["set-cookie"]
    # Without a live session there is nothing to protect: the cookie is cleared.
    stale = client.post("/dashboard/logout", headers={"Cookie": f"{COOKIE}=orch_revoked"})
    assert (stale.status_code, stale.headers["location"]) == (303, "/dashboard/login")
