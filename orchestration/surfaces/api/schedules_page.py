"""``/dashboard/schedules``: the owner's schedules, their next fire times, whether they are
paused, and the latest fires with the runs they made (or why a fire was skipped)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from orchestration.surfaces.api.dashboard import render, signed_in_as, to_login

router = APIRouter(prefix="/dashboard", include_in_schema=False)


@router.get("/schedules")
async def schedules_page(request: Request) -> Response:
    """What ``orchestration schedules list`` says, as a page."""
    signed = await run_in_threadpool(signed_in_as, request)
    if signed is None:
        return to_login()
    if signed.operator:
        return render(
            "error.html", 403, **signed.page(), title="Refused",
            message="schedules belong to their owner; sign in with the owner's token",
        )  # fmt: skip
    now = signed.orch.clock()
    shown = await run_in_threadpool(lambda: signed.orch.schedules(owner=signed.owner))
    return render("schedules.html", **signed.page(), schedules=shown, now=now)
