"""``/dashboard/schedules``: the owner's schedules, their next fire times, whether they are
paused, and the latest fires with the runs they made (or why a fire was skipped); a pause or
resume button on each (a plain form with the session's CSRF value)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from orchestration.core.errors import ValidationError
from orchestration.surfaces.api.auth import csrf_ok
from orchestration.surfaces.api.dashboard import form_of, render, signed_in_as, to_login

router = APIRouter(prefix="/dashboard", include_in_schema=False)


@router.get("/schedules")
async def schedules_page(request: Request) -> Response:
    """What ``orchestration schedules list`` says, as a page."""
    signed = await run_in_threadpool(signed_in_as, request)
    if signed is None:
        return to_login()
    if signed.operator:
        return render(
            "error.html",
            403,
            **signed.page(),
            title="Refused",
            message="schedules belong to their owner; sign in with the owner's token",
        )
    now = signed.orch.clock()
    shown = await run_in_threadpool(lambda: signed.orch.schedules(owner=signed.owner))
    return render("schedules.html", **signed.page(), schedules=shown, now=now)


async def _switch(request: Request, name: str, *, paused: bool) -> Response:
    """A pause or resume button: the same call as ``POST /schedules/{name}/pause``."""
    signed = await run_in_threadpool(signed_in_as, request)
    if signed is None:
        return to_login()
    form = await form_of(request)
    if signed.operator:
        return render(
            "error.html",
            403,
            **signed.page(),
            title="Refused",
            message="schedules are paused and resumed by their owner",
        )
    if not csrf_ok(signed.token, form.get("csrf", "")):
        return render(
            "error.html",
            403,
            **signed.page(),
            title="Refused",
            message="the form is stale or came from another site; reload the schedules page",
        )
    switch = signed.orch.pause_schedule if paused else signed.orch.resume_schedule
    try:
        await run_in_threadpool(lambda: switch(name, owner=signed.owner))
    except ValidationError as exc:
        return render("error.html", 404, **signed.page(), title="Not found", message=str(exc))
    return RedirectResponse("/dashboard/schedules", status_code=303)


@router.post("/schedules/{name}/pause")
async def pause_schedule(request: Request, name: str) -> Response:
    """The pause button."""
    return await _switch(request, name, paused=True)


@router.post("/schedules/{name}/resume")
async def resume_schedule(request: Request, name: str) -> Response:
    """The resume button."""
    return await _switch(request, name, paused=False)
