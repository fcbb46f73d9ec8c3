"""``/workflows``: register a definition as ``name@version`` and read the caller's (and the
published) definitions. ``POST /runs`` with ``{"workflow": "research@3"}`` launches one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Response

from orchestration.surfaces.api.auth import ApiOwner, Orch

router = APIRouter(prefix="/workflows", tags=["workflows"])


@router.post("", status_code=201, summary="Register a workflow definition")
def register(
    response: Response,
    owner: ApiOwner,
    orch: Orch,
    definition: dict[str, Any] = Body(description="The workflow: name, steps, args_schema."),  # noqa: B008
) -> dict[str, Any]:
    """Validate and store it as the next version of its name: ``201``; the same content as
    a stored version is a no-op: ``200`` with that version; ``400`` names a bad field."""
    found, created = orch.register_workflow(definition, owner=owner)
    if not created:
        response.status_code = 200
    return {**found.summary(), "created": created}


@router.get("", summary="List workflow definitions")
def list_definitions(owner: ApiOwner, orch: Orch) -> list[dict[str, Any]]:
    """The caller's definitions and the published ones, every version, newest first."""
    return [one.summary() for one in orch.workflows(owner=owner)]


@router.get("/{ref}", summary="Get a workflow definition")
def get_definition(ref: str, owner: ApiOwner, orch: Orch) -> dict[str, Any]:
    """``name`` (the latest version) or ``name@version``, with the stored definition; ``400``
    ``validation_error`` (field ``workflow``) when none is registered."""
    found = orch.workflow(ref, owner=owner)
    return {**found.summary(), "definition": found.definition}
