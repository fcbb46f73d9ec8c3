"""The runs dashboard: server-rendered HTML, no build step; one static script updates a
live run's page in place, and every page works without it.

Auth is the API token in the session cookie (:mod:`orchestration.surfaces.api.signin`) or a
bearer header. State-changing forms carry a CSRF value derived from the token. Templates
autoescape everything, and the pages hold no inline script or style, so the
Content-Security-Policy (:mod:`orchestration.surfaces.api.headers`) allows none. The runs list
shows summaries, never a run's payloads.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from orchestration.core.errors import (
    ConflictError,
    IdempotencyConflict,
    OrchestrationError,
    RunNotFound,
    ValidationError,
)
from orchestration.core.followups import Done
from orchestration.core.states import RUN_TERMINAL, Health, RunStatus
from orchestration.execution import approving
from orchestration.limits import suspensions
from orchestration.reads.records import RunRecord
from orchestration.runs import reruns
from orchestration.service import Orchestrator
from orchestration.surfaces.api import paging, timeline
from orchestration.surfaces.api.auth import csrf_ok, csrf_value, dashboard_token, resolve
from orchestration.surfaces.api.auth import orchestrator as app_orchestrator

router = APIRouter(prefix="/dashboard", include_in_schema=False)

#: Runs per dashboard page.
PAGE_SIZE = 50

#: The stylesheet and the run page's script, served as ``/dashboard/static/NAME``.
STATIC = Path(__file__).parent / "static"

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def duration(seconds: float) -> str:
    """``95`` -> ``1m 35s``: two units at most, for a laptop-width column."""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def relative(now: datetime, when: datetime | None) -> str:
    """``in 12s`` / ``3m 2s ago`` / ``-``."""
    if when is None:
        return "-"
    delta = (when - now).total_seconds()
    return f"in {duration(delta)}" if delta >= 0 else f"{duration(delta)} ago"


def stamp(when: datetime | str | None) -> str:
    """``2026-01-01 12:00:00`` (UTC), from a datetime or the ISO text a JSON column keeps."""
    if isinstance(when, str):
        when = datetime.fromisoformat(when)
    return when.strftime("%Y-%m-%d %H:%M:%S") if when else "-"


def preview(value: Any, limit: int = 160) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_templates.filters.update(duration=duration, stamp=stamp, preview=preview)


def render(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A dashboard page from its template (every value escaped)."""
    return HTMLResponse(_templates.get_template(name).render(**context), status_code=status_code)


def to_login() -> RedirectResponse:
    """Where a request that is not signed in goes."""
    return RedirectResponse("/dashboard/login", status_code=303)


@dataclass(frozen=True)
class Signed:
    """Who is signed in: an owner, or an operator (``owner`` ``""``) who sees every owner's
    runs and may cancel any of them."""

    orch: Orchestrator
    token: str
    owner: str
    operator: str | None

    def owner_of(self, run_id: str) -> str:
        """The owner to act as on ``run_id``: the run's, for an operator."""
        return self.orch.owner_of(run_id) if self.operator else self.owner

    def page(self, **context: Any) -> dict[str, Any]:
        """What every page's header shows, and the session's CSRF value its forms carry
        (the sign-out form in the header is one)."""
        return {
            "owner": self.owner,
            "operator": self.operator,
            "csrf": csrf_value(self.token),
            **self._suspensions(),
            **context,
        }

    def _suspensions(self) -> dict[str, Any]:
        """The banner of a suspended owner's pages (``suspension``), or for an operator the
        suspended owners (``suspended``): one read of a small table per page."""
        if self.operator:
            listed = self.orch.transact(lambda session: Done(suspensions.current(session)))
            return {"suspended": list(listed.values())}
        held = self.orch.transact(lambda session: Done(suspensions.of(session, self.owner)))
        return {"suspension": held}


def signed_in_as(request: Request) -> Signed | None:
    """The signed-in caller; ``None`` when not signed in."""
    orch = app_orchestrator(request)
    token = dashboard_token(request)
    found = resolve(orch, token)
    if token is None or found is None:
        return None
    return Signed(orch, token, *found)


@router.get("", response_class=HTMLResponse)
def runs_page(
    request: Request,
    status: Annotated[str | None, Query()] = None,
    health: Annotated[str | None, Query()] = None,
    cursor: Annotated[str | None, Query()] = None,
    refresh: Annotated[int | None, Query(ge=2, le=3600)] = None,
    owner: Annotated[str | None, Query()] = None,
    deleted: Annotated[str | None, Query()] = None,
) -> Response:
    """The caller's top-level runs (an operator's: every owner's, ``owner`` filtering),
    newest first, filterable by status and health, each with its branch count; branch runs
    are listed on their parent's page. ``deleted`` is the run the delete button just
    deleted, said in a notice (only an id is shown: the link carries nothing else)."""
    signed_in = signed_in_as(request)
    if signed_in is None:
        return to_login()
    orch = signed_in.orch
    status, health, owner = status or None, health or None, owner or None
    filters = {"status": status, "health": health, "refresh": refresh}
    if signed_in.operator:
        filters["owner"] = owner
    error: str | None = None
    try:
        runs, last = paging.page(
            orch,
            owner=(owner if signed_in.operator else signed_in.owner),
            status=status,
            health=health,
            limit=PAGE_SIZE,
            after=paging.start_key(cursor, None),
            top_level=True,
        )
    except OrchestrationError as exc:
        runs, last, error = [], None, str(exc)
    now = orch.clock()
    older = None
    if last is not None:
        older = "?" + urlencode(
            {k: v for k, v in {**filters, "cursor": last.encode()}.items() if v is not None}
        )
    return render(
        "runs.html",
        **signed_in.page(),
        runs=runs,
        now=now,
        relative=relative,
        filters=filters,
        statuses=[s.value for s in RunStatus],
        healths=[h.value for h in Health],
        error=error,
        older=older,
        refresh=refresh,
        deleted=(deleted or "")[:64] or None,
    )


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(
    request: Request,
    run_id: str,
    refresh: Annotated[int | None, Query(ge=2, le=3600)] = None,
) -> Response:
    """One run: its steps, its journal as a timeline, the explanation, and a cancel button
    (live) or a rerun form (ended other than completed) and a delete button (ended, top-level,
    for its owner)."""
    signed_in = signed_in_as(request)
    if signed_in is None:
        return to_login()
    orch = signed_in.orch
    try:
        owner = signed_in.owner_of(run_id)
        record = orch.get(run_id, owner=owner)
        summary = orch.explain(run_id, owner=owner)
        journal = orch.events(run_id, owner=owner)
    except RunNotFound as exc:
        return render("error.html", 404, **signed_in.page(), title="Not found", message=str(exc))
    now = orch.clock()
    return render(
        "run.html",
        **signed_in.page(),
        run=record,
        explain=summary,
        events=journal,
        timeline=timeline.build(record, journal, now),
        geometry=timeline,
        now=now,
        relative=relative,
        terminal=RunStatus(record.status) in RUN_TERMINAL,
        rerunnable=RunStatus(record.status) in reruns.RERUNNABLE,
        # One request id per rendered form: a double submit launches one rerun.
        rerun_request=f"dashboard-{secrets.token_urlsafe(16)}",
        refresh=refresh,
        max_comment=approving.MAX_COMMENT_CHARS,
    )


async def form_of(request: Request) -> dict[str, str]:
    """A urlencoded form, parsed here rather than through python-multipart: the body is
    already bounded by the BodyLimit middleware. A field sent empty is kept as ``""`` (the
    launch form shows it empty again rather than refilling its default)."""
    fields = parse_qs(
        (await request.body()).decode("utf-8", "replace"),
        keep_blank_values=True,
        max_num_fields=100,
    )
    return {key: values[0] for key, values in fields.items()}


async def _posted(
    request: Request,
    run_id: str,
    act: Callable[[Orchestrator, str, dict[str, str], str | None], str],
    *,
    operator_may: bool = False,
) -> Response:
    """A run page's form: signed in, its CSRF value checked, ``act`` run (with who acts, for
    the journal: ``operator NAME``, or ``None`` for the owner), then the page it names shown
    (303, so a reload does not repost): the same run, a new rerun, or the run list. An
    operator may only cancel (``operator_may``): approving, rerunning and deleting are the
    owner's."""
    signed_in = await run_in_threadpool(signed_in_as, request)
    if signed_in is None:
        return to_login()
    form = await form_of(request)
    if not csrf_ok(signed_in.token, form.get("csrf", "")):
        return render(
            "error.html",
            403,
            **signed_in.page(),
            title="Refused",
            message="the form is stale or came from another site; reload the run page",
        )
    if signed_in.operator and not operator_may:
        return render(
            "error.html",
            403,
            **signed_in.page(),
            title="Refused",
            message="an operator cancels runs; approving, rerunning and deleting are the owner's",
        )
    by = f"operator {signed_in.operator}" if signed_in.operator else None
    try:
        owner = await run_in_threadpool(signed_in.owner_of, run_id)
        shown = await run_in_threadpool(act, signed_in.orch, owner, form, by)
    except RunNotFound as exc:
        return render("error.html", 404, **signed_in.page(), title="Not found", message=str(exc))
    except (ConflictError, IdempotencyConflict, ValidationError) as exc:
        return render("error.html", 409, **signed_in.page(), title="Not done", message=str(exc))
    return RedirectResponse(shown, status_code=303)


def page_of(record: RunRecord) -> str:
    """The dashboard page of a run."""
    return f"/dashboard/runs/{record.id}"


@router.post("/runs/{run_id}/cancel")
async def cancel_run(request: Request, run_id: str) -> Response:
    """The cancel button."""
    return await _posted(
        request,
        run_id,
        lambda orch, owner, form, by: page_of(
            orch.cancel(run_id, owner=owner, graceful=form.get("graceful") == "true", by=by)
        ),
        operator_may=True,
    )


@router.post("/runs/{run_id}/steps/{step_id}/approval")
async def decide_approval(request: Request, run_id: str, step_id: str) -> Response:
    """The approve and reject buttons of an approval step."""
    return await _posted(
        request,
        run_id,
        lambda orch, owner, form, _: page_of(
            orch.approve(
                run_id,
                step_id,
                owner=owner,
                approve=form.get("decision") == "approve",
                comment=(form.get("comment") or "").strip()[: approving.MAX_COMMENT_CHARS] or None,
            )
        ),
    )


@router.post("/runs/{run_id}/rerun")
async def rerun_run(request: Request, run_id: str) -> Response:
    """The rerun form: the same domain call as ``POST /runs/{id}/rerun``, then the new run."""
    return await _posted(
        request,
        run_id,
        lambda orch, owner, form, _: page_of(
            orch.rerun(
                run_id,
                owner=owner,
                from_step=form.get("from_step") or None,
                request_id=form.get("request_id") or None,
            )
        ),
    )


@router.post("/runs/{run_id}/delete")
async def delete_run(request: Request, run_id: str) -> Response:
    """The delete button of an ended run: the same domain call as ``DELETE /runs/{id}``, then
    the run list saying what went. A live run or one still cleaning up is refused (409, the
    message saying why and what to do)."""
    return await _posted(
        request,
        run_id,
        lambda orch, owner, form, _: (
            "/dashboard?"
            + urlencode({"deleted": orch.delete(run_id, owner=owner, by="dashboard").run_id})
        ),
    )
