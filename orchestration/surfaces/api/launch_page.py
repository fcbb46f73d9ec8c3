"""``/dashboard/launch``: launch a registered definition from a form built from its
``args_schema`` (a JSON textarea when it has none), with a request id made when the form is
rendered, so a double submit launches one run. Works without JavaScript; an error is shown
at the field it names."""

from __future__ import annotations

import json
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from orchestration import definitions
from orchestration.errors import IdempotencyConflict, OrchestrationError, ValidationError
from orchestration.surfaces.api.auth import csrf_ok
from orchestration.surfaces.api.dashboard import Signed, form_of, render, signed_in_as, to_login

router = APIRouter(prefix="/dashboard", include_in_schema=False)

#: ``args_schema`` types a form field can hold as text; the others are JSON.
_SCALARS = {"string", "integer", "number", "boolean"}


def fields_of(schema: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One form field per top-level property: ``{name, kind, required, enum, description}``;
    ``kind`` is the scalar type, or ``json`` for objects, arrays and unions."""
    if not schema:
        return []
    required = set(schema.get("required", []))
    found = []
    for name, sub in (schema.get("properties") or {}).items():
        kind = sub.get("type")
        found.append(
            {
                "name": name,
                "kind": kind if isinstance(kind, str) and kind in _SCALARS else "json",
                "required": name in required,
                "enum": sub.get("enum"),
                "description": sub.get("description") or sub.get("title") or "",
                "default": sub.get("default"),
            }
        )
    return found


def args_from(form: dict[str, str], fields: list[dict[str, Any]]) -> dict[str, Any]:
    """The launch's args from the submitted form. A field left empty is left out (the schema
    says whether that is allowed); a number or JSON that does not parse is a
    :class:`ValidationError` naming ``args.<field>``."""
    if not fields:
        text = form.get("args", "").strip() or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError("args", f"is not JSON: {exc.msg}") from None
        if not isinstance(value, dict):
            raise ValidationError("args", "must be a JSON object of the workflow's args")
        return value
    args: dict[str, Any] = {}
    for field in fields:
        name, kind = field["name"], field["kind"]
        raw = form.get(f"arg.{name}", "")
        if kind == "boolean":
            if raw:
                args[name] = raw == "true"
            continue
        if raw == "":
            continue
        if field["enum"]:
            # The select's options are the enum's values as text: take the value back typed.
            chosen = [option for option in field["enum"] if str(option) == raw]
            if not chosen:
                raise ValidationError(f"args.{name}", f"must be one of {field['enum']!r}")
            args[name] = chosen[0]
            continue
        try:
            if kind == "integer":
                args[name] = int(raw)
            elif kind == "number":
                args[name] = float(raw)
            elif kind == "json":
                args[name] = json.loads(raw)
            else:
                args[name] = raw
        except ValueError:
            wanted = {"integer": "a whole number", "number": "a number"}.get(kind, "JSON")
            raise ValidationError(f"args.{name}", f"{raw[:40]!r} is not {wanted}") from None
    return args


def _choices(signed: Signed) -> list[definitions.Definition]:
    return list(signed.orch.workflows(owner=signed.owner))


@router.get("/launch")
async def launch_form(
    request: Request, workflow: Annotated[str | None, Query()] = None
) -> Response:
    """Choose a definition and version; its args as form fields."""
    signed = await run_in_threadpool(signed_in_as, request)
    if signed is None:
        return to_login()
    return await _form(signed, workflow, {}, None, status_code=200)


async def _form(
    signed: Signed,
    ref: str | None,
    given: dict[str, str],
    error: ValidationError | OrchestrationError | None,
    *,
    status_code: int,
) -> Response:
    if signed.operator:
        return render(
            "error.html", 403, **signed.page(), title="Refused",
            message="an operator launches nothing: runs belong to their owner",
        )  # fmt: skip
    choices = await run_in_threadpool(_choices, signed)
    chosen = next((one for one in choices if one.ref == ref), choices[0] if choices else None)
    fields = fields_of(chosen.definition.get("args_schema")) if chosen else []
    field = error.field if isinstance(error, ValidationError) else None
    return render(
        "launch.html",
        status_code,
        **signed.page(),
        choices=choices,
        chosen=chosen,
        fields=fields,
        given=given,
        error=str(error) if error else None,
        error_field=field.removeprefix("args.") if field else None,
        request_id=given.get("request_id") or f"dashboard-{secrets.token_urlsafe(16)}",
    )


@router.post("/launch")
async def launch(request: Request) -> Response:
    """Launch the chosen version with the form's args; the new run's page, or the form
    again with the error at its field."""
    signed = await run_in_threadpool(signed_in_as, request)
    if signed is None:
        return to_login()
    form = await form_of(request)
    if not csrf_ok(signed.token, form.get("csrf", "")):
        return render(
            "error.html", 403, **signed.page(), title="Refused",
            message="the form is stale or came from another site; reload the launch page",
        )  # fmt: skip
    ref = form.get("workflow", "")
    try:
        chosen = await run_in_threadpool(signed.orch.workflow, ref, owner=signed.owner)
        args = args_from(form, fields_of(chosen.definition.get("args_schema")))
        record = await run_in_threadpool(
            lambda: signed.orch.launch(
                chosen.ref, args, owner=signed.owner, request_id=form.get("request_id") or None
            )
        )
    except (ValidationError, IdempotencyConflict) as exc:
        return await _form(signed, ref, form, exc, status_code=400)
    return RedirectResponse(f"/dashboard/runs/{record.id}", status_code=303)
