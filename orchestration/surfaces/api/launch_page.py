"""``/dashboard/launch``: launch a registered definition from a form built from its
``args_schema`` (:mod:`~orchestration.surfaces.api.launch_fields`; a JSON textarea when it has
none), with a request id made when the form is rendered, so a double submit launches one run.
Works without JavaScript; every error is shown at the field it names."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from orchestration.core.errors import IdempotencyConflict, ValidationError
from orchestration.surfaces.api.auth import csrf_ok
from orchestration.surfaces.api.dashboard import Signed, form_of, render, signed_in_as, to_login
from orchestration.surfaces.api.launch_fields import FormField, field_of, fields_of, read
from orchestration.workflows import registry

router = APIRouter(prefix="/dashboard", include_in_schema=False)


def _choices(signed: Signed) -> list[registry.Definition]:
    return list(signed.orch.workflows(owner=signed.owner))


def chosen_of(choices: list[registry.Definition], ref: str | None) -> registry.Definition | None:
    """The definition ``ref`` names: ``name@version``, or a bare name's latest version (the
    owner's own before a shared one); the first choice when it names none."""
    if ref:
        exact = [one for one in choices if one.ref == ref]
        named = sorted(
            (one for one in choices if one.name == ref),
            key=lambda one: (not one.shared, one.version),
        )
        if exact or named:
            return (exact or named)[-1]
    return choices[0] if choices else None


def _where(error: ValidationError, fields: list[FormField]) -> str:
    """The field an error of the whole launch is shown at: a schema field, the JSON
    textarea (``args``) for an error in the args of a workflow without a schema, or none
    (``""``)."""
    if fields:
        return field_of(error.field, fields) or ""
    return "args" if error.field == "args" or error.field.startswith("args.") else ""


@router.get("/launch")
async def launch_form(
    request: Request, workflow: Annotated[str | None, Query()] = None
) -> Response:
    """Choose a definition and version; its args as form fields."""
    signed = await run_in_threadpool(signed_in_as, request)
    if signed is None:
        return to_login()
    return await _form(signed, workflow, {}, {}, status_code=200)


async def _form(
    signed: Signed,
    ref: str | None,
    given: dict[str, str],
    errors: dict[str, str],
    *,
    status_code: int,
) -> Response:
    """The form for ``ref``, holding what was ``given`` and each field's error (``errors``
    under ``""``: an error of no field, shown above the button)."""
    if signed.operator:
        return render(
            "error.html",
            403,
            **signed.page(),
            title="Refused",
            message="an operator launches nothing: runs belong to their owner",
        )
    choices = await run_in_threadpool(_choices, signed)
    chosen = chosen_of(choices, ref)
    return render(
        "launch.html",
        status_code,
        **signed.page(),
        choices=choices,
        chosen=chosen,
        fields=fields_of(chosen.definition.get("args_schema")) if chosen else [],
        given=given,
        errors=errors,
        request_id=given.get("request_id") or f"dashboard-{secrets.token_urlsafe(16)}",
    )


@router.post("/launch")
async def launch(request: Request) -> Response:
    """Launch the chosen version with the form's args; the new run's page, or the form
    again with each error at its field and nothing launched."""
    signed = await run_in_threadpool(signed_in_as, request)
    if signed is None:
        return to_login()
    form = await form_of(request)
    if not csrf_ok(signed.token, form.get("csrf", "")):
        return render(
            "error.html",
            403,
            **signed.page(),
            title="Refused",
            message="the form is stale or came from another site; reload the launch page",
        )
    ref = form.get("workflow", "")
    fields: list[FormField] = []
    try:
        chosen = await run_in_threadpool(signed.orch.workflow, ref, owner=signed.owner)
        fields = fields_of(chosen.definition.get("args_schema"))
        args, errors = read(form, fields)
        if errors:
            return await _form(signed, ref, form, errors, status_code=400)
        record = await run_in_threadpool(
            lambda: signed.orch.launch(
                chosen.ref, args, owner=signed.owner, request_id=form.get("request_id") or None
            )
        )
    except ValidationError as exc:
        # What the whole launch checks beyond each field: a limit, an unknown argument, a
        # placeholder the args do not fill; at its field when it names one.
        return await _form(signed, ref, form, {_where(exc, fields): str(exc)}, status_code=400)
    except IdempotencyConflict as exc:
        return await _form(signed, ref, form, {"": str(exc)}, status_code=400)
    return RedirectResponse(f"/dashboard/runs/{record.id}", status_code=303)
